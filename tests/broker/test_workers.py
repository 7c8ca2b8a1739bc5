"""--workers N: the options, each worker's own options, the cluster name and the restart backoff."""

from __future__ import annotations

import pytest

from rabbitflow_broker.cli.broker import main
from rabbitflow_broker.cli.config import ConfigError, load_config
from rabbitflow_broker.cli.workers import (
    WORKER_ENV,
    RestartPolicy,
    Supervisor,
    cluster_name,
    worker_index,
    worker_options,
)


def test_one_worker_is_the_default() -> None:
    assert load_config([], {}).workers == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "0"], "--workers: must be at least 1"),
        (["--workers", "-2"], "--workers: must be a non-negative integer"),
        (["--workers", "two"], "--workers: expected an integer"),
        (["--workers", "1000"], "--workers: at most 256"),
        (["--workers", "2", "--listen", "127.0.0.1:0"], "--listen needs a fixed port"),
        (
            [
                "--workers",
                "2",
                "--listen-tls",
                "127.0.0.1:0",
                "--tls-cert",
                __file__,
                "--tls-key",
                __file__,
            ],
            "--listen-tls needs a fixed port",
        ),
        (["--workers", "3", "--admin-listen", "127.0.0.1:65534"], "65534..65536"),
    ],
)
def test_bad_worker_counts_are_refused_naming_the_option(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        load_config(argv, {})


def test_a_refused_worker_count_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workers", "0"]) == 2
    assert "--workers: must be at least 1" in capsys.readouterr().err


def test_workers_from_the_environment() -> None:
    assert load_config([], {"RABBITFLOW_BROKER_WORKERS": "4"}).workers == 4


def test_each_worker_gets_its_admin_port_event_log_and_the_cluster() -> None:
    config = load_config(
        ["--workers", "3", "--admin-listen", "127.0.0.1:16000", "--event-log", "/var/log/ev.jsonl"],
        {},
    )
    assert worker_options(config, 0, "c1") == [
        "--cluster",
        "c1",
        "--admin-listen",
        "127.0.0.1:16000",
        "--event-log",
        "/var/log/ev-w0.jsonl",
    ]
    assert worker_options(config, 2, "c1")[3:] == [
        "127.0.0.1:16002",
        "--event-log",
        "/var/log/ev-w2.jsonl",
    ]


def test_admin_port_0_lets_each_worker_pick_one_and_ipv6_keeps_its_brackets() -> None:
    config = load_config(["--workers", "2", "--admin-listen", "[::1]:0"], {})
    assert worker_options(config, 1, "c") == ["--cluster", "c", "--admin-listen", "[::1]:0"]


def test_the_workers_command_is_the_supervisors_options_then_the_workers_own() -> None:
    argv = ["--workers", "2", "--listen", "127.0.0.1:5999", "--admin-listen", "127.0.0.1:16100"]
    supervisor = Supervisor(load_config(argv, {}), argv)
    command = supervisor.command(1)
    assert command[1:3] == ["-m", "rabbitflow_broker.cli"]
    assert command[3 : 3 + len(argv)] == argv
    assert command[3 + len(argv) :] == worker_options(supervisor.config, 1, supervisor.cluster)
    # Later options win: the worker's own admin port is the one it uses.
    worker = load_config(command[3:], {})
    assert worker.admin_address == ("127.0.0.1", 16101)
    assert worker.cluster == supervisor.cluster
    assert worker.workers == 2


def test_cluster_name_is_the_given_one_or_derived_from_host_and_port() -> None:
    named = load_config(["--workers", "2", "--cluster", "orders"], {})
    assert cluster_name(named, "h") == "orders"
    unnamed = load_config(["--workers", "2", "--listen", "0.0.0.0:5800"], {})
    assert cluster_name(unnamed, "gw1.example.com") == "workers-gw1.example.com-5800"
    tls_only = load_config(
        [
            "--listen",
            "none",
            "--listen-tls",
            "0.0.0.0:5671",
            "--tls-cert",
            __file__,
            "--tls-key",
            __file__,
        ],
        {},
    )
    assert cluster_name(tls_only, "h") == "workers-h-5671"
    odd = cluster_name(unnamed, "a host/with:odd*chars" + "x" * 100)
    derived = load_config(["--cluster", odd], {})  # a valid --cluster value
    assert derived.cluster == odd
    assert len(odd) <= 64
    assert odd.endswith("-5800")


def test_worker_index_comes_from_the_environment() -> None:
    assert worker_index({}) is None
    assert worker_index({WORKER_ENV: "3"}) == 3
    assert worker_index({WORKER_ENV: "x"}) is None


def test_restart_backoff_doubles_to_its_maximum_and_starts_over_after_a_healthy_run() -> None:
    policy = RestartPolicy(initial=0.5, maximum=4.0, healthy_after=30.0)
    assert [policy.delay(1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.delay(31.0) == 0.5
    assert policy.delay(0.1) == 1.0
