"""rabbitflow-broker's conventions: --version, --log-level, environment variables
named in --help, durations in ms, and a missing extra named instead of a traceback."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import rabbitflow_broker
from rabbitflow_broker import accel
from rabbitflow_broker.cli import launch
from rabbitflow_broker.cli.broker import configure_logging, main
from rabbitflow_broker.cli.config import ConfigError, GatewayConfig, build_parser, load_config


def test_version_names_the_package_version_and_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        load_config(["--version"], {})

    assert exited.value.code == 0
    expected = f"rabbitflow-broker {rabbitflow_broker.__version__} (engine: {accel.status()})"
    assert capsys.readouterr().out.strip() == expected


def test_help_names_the_environment_variable_of_every_option() -> None:
    text = " ".join(build_parser().format_help().split())

    missing = [
        f"RABBITFLOW_BROKER_{field.name.upper()}"
        for field in dataclasses.fields(GatewayConfig)
        if f"[env: RABBITFLOW_BROKER_{field.name.upper()}]" not in text
    ]
    assert missing == []
    assert "[env: RABBITFLOW_BROKER_CONFIG]" in text


def test_log_level_defaults_to_info_and_comes_from_every_source(tmp_path: Path) -> None:
    assert load_config([], {}).log_level == "info"
    assert load_config(["--log-level", "DEBUG"], {}).log_level == "debug"
    assert load_config([], {"RABBITFLOW_BROKER_LOG_LEVEL": "warning"}).log_level == "warning"
    toml = tmp_path / "gateway.toml"
    toml.write_text('log-level = "error"\n')
    assert load_config(["--config", str(toml)], {}).log_level == "error"


def test_a_bad_log_level_names_the_option() -> None:
    with pytest.raises(ConfigError, match="--log-level"):
        load_config([], {"RABBITFLOW_BROKER_LOG_LEVEL": "loud"})
    with pytest.raises(SystemExit):
        load_config(["--log-level", "loud"], {})


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize(
    ("level", "expected"), [("debug", logging.DEBUG), ("warning", logging.WARNING)]
)
def test_configure_logging_applies_the_level(
    root_logging: logging.Logger, level: str, expected: int
) -> None:
    configure_logging("json", level)

    assert root_logging.level == expected
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() >= logging.WARNING


def test_drain_timeout_is_in_milliseconds() -> None:
    assert load_config([], {}).drain_timeout == 10_000
    assert load_config(["--drain-timeout", "2500"], {}).drain_timeout == 2500
    assert load_config([], {"RABBITFLOW_BROKER_DRAIN_TIMEOUT": "750"}).drain_timeout == 750


def test_the_seconds_form_is_a_deprecated_alias(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning, match="use --drain-timeout 3000"):
        assert load_config(["--drain-timeout-seconds", "3"], {}).drain_timeout == 3000
    env = {"RABBITFLOW_BROKER_DRAIN_TIMEOUT_SECONDS": "4"}
    with pytest.warns(FutureWarning, match="RABBITFLOW_BROKER_DRAIN_TIMEOUT_SECONDS"):
        assert load_config([], env).drain_timeout == 4000
    toml = tmp_path / "gateway.toml"
    toml.write_text("drain-timeout-seconds = 5\n")
    with pytest.warns(FutureWarning, match="drain-timeout-seconds in"):
        assert load_config(["--config", str(toml)], {}).drain_timeout == 5000
    # The millisecond option given beside it wins: it is the later, more specific one.
    with pytest.warns(FutureWarning):
        config = load_config(["--drain-timeout-seconds", "3", "--drain-timeout", "100"], {})
    assert config.drain_timeout == 100


def test_the_cli_prints_the_deprecation_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--drain-timeout-seconds", "3", "--listen", "nowhere"]) == 2

    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "rabbitflow-broker: warning: --drain-timeout-seconds is deprecated: "
        "use --drain-timeout 3000 (milliseconds)"
    )
    assert err[1].startswith("rabbitflow-broker: --listen")


@pytest.fixture
def broker_extra_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(launch.EXTRAS, "broker", ("aiohttp", "rabbitflow_no_such_module"))
    monkeypatch.setitem(launch.EXTRAS, "pipeline", ("rabbitflow_no_such_module",))


@pytest.mark.usefixtures("broker_extra_missing")
@pytest.mark.parametrize(
    ("entry", "prog", "extra"),
    [
        (launch.broker, "rabbitflow-broker", "broker"),
        (launch.demo, "rabbitflow-demo", "broker"),
        (launch.analyze, "rabbitflow-analyze", "pipeline"),
    ],
)
@pytest.mark.parametrize("argv", [[], ["--help"], ["--listen", "0.0.0.0:5673"]])
def test_a_missing_extra_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str],
    entry: launch.Entry,
    prog: str,
    extra: str,
    argv: list[str],
) -> None:
    assert entry(argv) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{prog}: needs the '{extra}' extra")
    assert err.endswith(f"pip install 'rabbitflow[{extra}]'\n")
    assert "rabbitflow_no_such_module" in err
    assert err.count("\n") == 1


@pytest.mark.usefixtures("broker_extra_missing")
def test_version_answers_without_the_extra(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.broker(["--version"]) == 0

    assert capsys.readouterr().out == f"rabbitflow-broker {rabbitflow_broker.__version__}\n"


def test_with_the_extra_the_entry_point_runs_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert launch.missing_modules("broker") == []
    with pytest.raises(SystemExit) as exited:
        launch.broker(["--help"])

    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: rabbitflow-broker")


def test_the_analyzer_has_version_and_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyspark")
    with pytest.raises(SystemExit) as exited:
        launch.analyze(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"rabbitflow-analyze {rabbitflow_broker.__version__}\n"

    with pytest.raises(SystemExit) as refused:
        launch.analyze(["--log-level", "loud", "events.jsonl", "--out", "out"])
    assert refused.value.code == 2
    assert "--log-level" in capsys.readouterr().err
