"""rabbitflow-config against a fake admin API over real HTTP."""

from __future__ import annotations

import base64
import json
import socket

import pytest

from rabbitflow_broker.cli.config_cli import declare_arguments, main
from tests.config_cli.conftest import FakeAdmin

ORDERS = {
    "name": "orders",
    "vhost": "/",
    "messages": 1200,
    "bytes": 34567,
    "flowStopCount": 100,
    "flowResumeCount": 50,
    "flowStopSize": 0,
    "flowResumeSize": 0,
    "source": "arguments",
    "flowStopped": True,
    "flowStoppedCount": 3,
    "blockedChannels": [{"connection": 7, "channel": 1, "blockedOn": ["orders"]}],
}
ORDERS_PATH = "/api/queues/%2F/orders"


def run(admin: FakeAdmin, *argv: str) -> int:
    return main(["--admin-url", admin.url, *argv], environ={})


def details(out: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in out.splitlines())  # type: ignore[misc]


def test_queues_prints_a_row_per_queue_with_thresholds_and_flow_state(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues", [ORDERS, {**ORDERS, "name": "idle", "flowStopped": False}])

    assert run(admin, "queues") == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["vhost", "queue", "msgs", "bytes"]
    orders = next(line.split() for line in lines if " orders " in line)
    assert orders == ["/", "orders", "1,200", "34,567", "100/50", "0/0", "Y", "3", "1"]
    assert any(line.split()[1] == "idle" and line.split()[6] == "N" for line in lines[2:])


def test_queues_json_prints_the_admin_answer(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues", [ORDERS])

    assert run(admin, "queues", "--json") == 0

    assert json.loads(capsys.readouterr().out) == [ORDERS]


def test_queues_with_vhost_shows_only_that_vhost(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues", [ORDERS, {**ORDERS, "vhost": "other", "name": "elsewhere"}])

    assert run(admin, "queues", "--vhost", "other", "--json") == 0

    assert [q["name"] for q in json.loads(capsys.readouterr().out)] == ["elsewhere"]


def test_queue_shows_details_and_encodes_the_vhost(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", ORDERS_PATH, ORDERS)

    assert run(admin, "queue", "orders") == 0

    shown = details(capsys.readouterr().out)
    assert admin.requests[0].path == ORDERS_PATH
    assert shown["flowStopCount"] == "100"
    assert shown["flowStopped"] == "True"
    assert shown["blockedChannels"] == "con:7/ch:1"


def test_queue_in_another_vhost_uses_its_encoded_name(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues/a%2Fb/q%20x", {**ORDERS, "vhost": "a/b", "name": "q x"})

    assert run(admin, "--vhost", "a/b", "queue", "q x", "--json") == 0

    assert json.loads(capsys.readouterr().out)["name"] == "q x"


def test_unknown_queue_is_one_line_on_stderr_and_exit_1(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues/%2F/nope", {"error": "queue 'nope' not found"}, status=404)

    assert run(admin, "queue", "nope") == 1

    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "queue 'nope' not found" in err


def test_set_flow_puts_only_the_given_thresholds(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("PUT", ORDERS_PATH + "/flow", {**ORDERS, "flowStopCount": 10})

    code = run(admin, "set-flow", "orders", "--flow-stop-count", "10", "--flow-resume-size", "0")

    assert code == 0
    request = admin.requests[0]
    assert (request.method, request.path) == ("PUT", ORDERS_PATH + "/flow")
    assert request.body == {"flowStopCount": 10, "flowResumeSize": 0}
    assert details(capsys.readouterr().out)["flowStopCount"] == "10"


def test_set_flow_without_a_threshold_is_a_usage_error_and_sends_nothing(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(admin, "set-flow", "orders") == 2

    assert admin.requests == []
    assert "--flow-stop-count" in capsys.readouterr().err


def test_set_flow_refused_by_the_gateway_exits_2_with_its_reason(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "flowResumeCount: must not be above flowStopCount (60 > 50)"
    admin.answer("PUT", ORDERS_PATH + "/flow", {"error": reason}, status=400)

    code = run(admin, "set-flow", "orders", "--flow-stop-count", "50", "--flow-resume-count", "60")

    assert code == 2
    assert capsys.readouterr().err == f"rabbitflow-config: refused: {reason}\n"


def test_set_flow_not_persisted_is_reported_as_a_warning(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("PUT", ORDERS_PATH + "/flow", {**ORDERS, "warning": "not persisted: 503"})

    assert run(admin, "set-flow", "orders", "--flow-stop-count", "100") == 0

    assert "warning: not persisted: 503" in capsys.readouterr().err


def test_negative_threshold_is_refused_before_any_request(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(admin, "set-flow", "orders", "--flow-stop-count", "-1") == 2

    assert admin.requests == []
    assert "non-negative" in capsys.readouterr().err


def test_stop_producers_posts_vhost_and_queue(admin: FakeAdmin) -> None:
    admin.answer("POST", "/api/producers/stop", {"stopped": True})

    assert run(admin, "stop-producers", "--vhost", "/", "--queue", "orders") == 0

    assert admin.requests[0].body == {"vhost": "/", "queue": "orders"}


def test_start_producers_without_options_posts_an_empty_scope(admin: FakeAdmin) -> None:
    admin.answer("POST", "/api/producers/start", {"started": True})

    assert run(admin, "start-producers") == 0

    assert (admin.requests[0].path, admin.requests[0].body) == ("/api/producers/start", {})


def test_producers_on_a_gateway_without_the_endpoint_says_so(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(admin, "stop-producers") == 1

    err = capsys.readouterr().err
    assert "does not support POST /api/producers/stop" in err
    assert err.count("\n") == 1


def test_unreachable_admin_api_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there

    assert main(["--admin-url", f"http://127.0.0.1:{port}", "queues"], environ={}) == 1

    err = capsys.readouterr().err
    assert err.startswith("rabbitflow-config: cannot reach the gateway admin API")
    assert err.count("\n") == 1


def test_refused_credentials_name_the_options(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/queues", {"error": "unauthorized"}, status=401)

    assert run(admin, "queues") == 1

    assert "--user and --password" in capsys.readouterr().err


def test_user_and_password_are_sent_as_basic_auth(admin: FakeAdmin) -> None:
    admin.answer("GET", "/api/queues", [])

    assert run(admin, "--user", "ops", "--password", "s3cret", "queues") == 0

    expected = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert admin.requests[0].headers["Authorization"] == expected


def test_admin_url_comes_from_the_environment(admin: FakeAdmin) -> None:
    admin.answer("GET", "/api/queues", [])

    assert main(["queues"], environ={"RABBITFLOW_ADMIN_URL": admin.url}) == 0

    assert admin.requests[0].path == "/api/queues"


def test_declare_arguments_map_maxima_and_thresholds() -> None:
    arguments = declare_arguments(
        max_count=1000,
        max_size=None,
        flow={"flow_stop_count": 100, "flow_resume_count": 50, "flow_stop_size": None},
    )

    assert arguments == {
        "x-max-length": 1000,
        "x-overflow": "reject-publish",
        "qpid.flow_stop_count": 100,
        "qpid.flow_resume_count": 50,
    }


def test_declare_arguments_keep_an_explicit_overflow() -> None:
    assert declare_arguments(max_size=4096, overflow="drop-head") == {
        "x-max-length-bytes": 4096,
        "x-overflow": "drop-head",
    }


def test_declare_arguments_without_options_are_empty() -> None:
    assert declare_arguments() == {}


def test_add_queue_with_unreachable_gateway_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    assert main(["--gateway-url", url, "add", "queue", "orders"], environ={}) == 1

    err = capsys.readouterr().err
    assert err.startswith("rabbitflow-config: cannot reach the gateway at")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", [[], ["queues"], ["add"], ["set-flow"], ["stop-producers"]])
def test_help_prints_usage_and_exits_0(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"], environ={}) == 0

    assert capsys.readouterr().out.startswith("usage: rabbitflow-config")


@pytest.mark.parametrize("command", ["stop-producers", "start-producers"])
def test_producer_commands_help_says_vhost_defaults_to_every_vhost(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert run(admin, command, "--help") == 0

    help_text = " ".join(capsys.readouterr().out.split())
    assert "every vhost for queues, stop-producers and start-producers" in help_text


def test_stop_producers_without_vhost_posts_no_vhost(admin: FakeAdmin) -> None:
    admin.answer("POST", "/api/producers/stop", {"stopped": True})

    assert run(admin, "stop-producers") == 0

    assert admin.requests[0].body == {}
