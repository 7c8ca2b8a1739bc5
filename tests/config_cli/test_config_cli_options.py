"""rabbitflow-config's conventions: --version, help on every option, one --vhost,
add-queue / delete-queue, and the admin password kept off the command line."""

from __future__ import annotations

import argparse
import base64
import socket

import pytest

import rabbitflow_broker
from rabbitflow_broker.cli.config_cli import PASSWORD_ENV, USER_ENV, build_parser, main
from tests.config_cli.conftest import FakeAdmin


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"], environ={}) == 0

    assert capsys.readouterr().out.strip() == f"rabbitflow-config {rabbitflow_broker.__version__}"


def _actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = [(parser.prog, action) for action in parser._actions]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _actions(sub)
    return found


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"{prog}: {action.option_strings or action.dest}"
        for prog, action in _actions(build_parser())
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]

    assert missing == []


def test_vhost_is_one_option_with_one_help_text() -> None:
    texts = {
        action.help for _, action in _actions(build_parser()) if "--vhost" in action.option_strings
    }

    assert len(texts) == 1


@pytest.mark.parametrize("position", ["before", "after"])
def test_vhost_is_taken_before_or_after_the_command(admin: FakeAdmin, position: str) -> None:
    admin.answer("GET", "/api/queues/dev/orders", {"name": "orders", "vhost": "dev"})
    vhost = ["--vhost", "dev"]
    argv = [*vhost, "queue", "orders"] if position == "before" else ["queue", "orders", *vhost]

    assert main(["--admin-url", admin.url, *argv], environ={}) == 0

    assert admin.requests[0].path == "/api/queues/dev/orders"


@pytest.mark.parametrize(
    "argv",
    [["add-queue", "orders"], ["add", "queue", "orders"], ["delete-queue", "orders"]],
)
def test_queue_commands_go_to_the_gateway_over_amqp(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens there: the command reaches the AMQP step and says so in one line.
    assert main(["--gateway-url", _closed_port_url(), *argv], environ={}) == 1

    err = capsys.readouterr().err
    assert err.startswith("rabbitflow-config: cannot reach the gateway at")
    assert err.count("\n") == 1


def test_add_with_another_object_type_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["add", "exchange", "orders"], environ={}) == 2

    assert "only 'queue'" in capsys.readouterr().err


def test_password_comes_from_the_environment(admin: FakeAdmin) -> None:
    admin.answer("GET", "/api/queues", [])

    code = main(
        ["--admin-url", admin.url, "queues"],
        environ={USER_ENV: "ops", PASSWORD_ENV: "from-env"},
    )

    assert code == 0
    assert admin.requests[0].headers["Authorization"] == _basic("ops", "from-env")


def test_password_is_prompted_for_when_a_user_is_given_without_one(admin: FakeAdmin) -> None:
    admin.answer("GET", "/api/queues", [])
    prompts: list[str] = []

    def prompt(text: str) -> str:
        prompts.append(text)
        return "typed"

    code = main(["--admin-url", admin.url, "--user", "ops", "queues"], environ={}, prompt=prompt)

    assert code == 0
    assert prompts == ["Password for ops on the gateway admin API: "]
    assert admin.requests[0].headers["Authorization"] == _basic("ops", "typed")


def test_no_prompt_without_a_user(admin: FakeAdmin) -> None:
    admin.answer("GET", "/api/queues", [])

    def prompt(text: str) -> str:
        raise AssertionError(f"prompted: {text}")

    assert main(["--admin-url", admin.url, "queues"], environ={}, prompt=prompt) == 0
    assert "Authorization" not in admin.requests[0].headers


def test_an_abandoned_prompt_is_a_usage_error(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    def prompt(text: str) -> str:
        raise EOFError

    code = main(["--admin-url", admin.url, "--user", "ops", "queues"], environ={}, prompt=prompt)

    assert code == 2
    assert capsys.readouterr().err == "rabbitflow-config: no password given\n"
    assert admin.requests == []


def test_help_names_the_password_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"], environ={}) == 0

    out = " ".join(capsys.readouterr().out.split())
    assert PASSWORD_ENV in out
    assert "add-queue" in out
    assert "delete-queue" in out


@pytest.mark.parametrize("level", ["debug", "WARNING"])
def test_log_level_is_accepted(admin: FakeAdmin, level: str) -> None:
    admin.answer("GET", "/api/queues", [])

    assert main(["--admin-url", admin.url, "--log-level", level, "queues"], environ={}) == 0


def test_a_bad_log_level_is_a_usage_error() -> None:
    assert main(["--log-level", "loud", "queues"], environ={}) == 2
