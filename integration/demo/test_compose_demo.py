"""The docker-compose demo path without Docker.

The gateway runs as a process with exactly the arguments and environment
that ``docker-compose.yml`` gives its ``gateway`` service (service names
and ports mapped to this machine); the demo runs with the ``demo``
service's arguments and environment against it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration.broker.conftest import serving, wait_for
from integration.conftest import Broker
from rabbitflow_broker.cli.demo import main
from rabbitflow_broker.server.rabbitmq_node import free_port

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
FAST = ["--messages", "150", "--consume-rate", "400"]


#: What the operator puts in the environment (compose requires it: ``${NAME:?}``).
OPERATOR_ENV = {"RABBITFLOW_ADMIN_PASSWORD": "compose-test-password"}


def _expand(value: str) -> str:
    """Compose's ``${NAME:-default}`` with NAME unset, as on a fresh checkout, and
    ``${NAME:?message}`` with the operator's value."""
    value = re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", lambda m: OPERATOR_ENV[m.group(1)], value)
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _service(name: str) -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services[name]


class _Mapped:
    """Compose's names and ports replaced by this machine's."""

    def __init__(self, broker: Broker) -> None:
        self.amqp = broker.url.split("@")[-1].split("/")[0]  # host:port of RabbitMQ
        self.management = (broker.management_url or "http://127.0.0.1:15672").rstrip("/")
        self.port = free_port()
        self.admin_port = free_port()

    def __call__(self, value: str) -> str:
        value = _expand(value)
        value = value.replace("rabbitmq:5672", self.amqp)
        value = value.replace("http://rabbitmq:15672", self.management)
        value = value.replace("0.0.0.0:5673", f"127.0.0.1:{self.port}")
        value = value.replace("0.0.0.0:15673", f"0.0.0.0:{self.admin_port}")
        value = value.replace("gateway:5673", f"127.0.0.1:{self.port}")
        return value.replace("http://gateway:15673", f"http://127.0.0.1:{self.admin_port}")


@pytest.fixture
def compose_gateway(broker: Broker, tmp_path: Path) -> Iterator[_Mapped]:
    """``rabbitflow-broker`` with the compose gateway's arguments and environment."""
    mapped = _Mapped(broker)
    gateway = _service("gateway")
    args = [mapped(a) for a in gateway["command"]]
    args = [a.replace("/var/log/rabbitflow", str(tmp_path)) for a in args]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_")}
    environ.update({k: mapped(str(v)) for k, v in gateway.get("environment", {}).items()})
    log = tmp_path / "gateway.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen([BROKER_CLI, *args], stderr=stderr, env=environ)
    try:
        wait_for(
            lambda: process.poll() is not None or serving(log),
            timeout=30,
            what="the compose gateway ready",
        )
        assert process.poll() is None, log.read_text()
        yield mapped
    finally:
        process.terminate()
        process.wait(30)


def _demo_argv(mapped: _Mapped) -> list[str]:
    return [mapped(str(a)) for a in _service("demo")["command"]] + FAST


@pytest.mark.slow
def test_compose_demo_authenticates_to_the_compose_gateway_and_passes(
    compose_gateway: _Mapped,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in [k for k in os.environ if k.startswith("RABBITFLOW_")]:
        monkeypatch.delenv(key)
    for key, value in _service("demo").get("environment", {}).items():
        monkeypatch.setenv(key, compose_gateway(str(value)))

    code = main(_demo_argv(compose_gateway))

    out = capsys.readouterr().out
    assert code == 0, out
    assert "exactly once, in order OK" in out


@pytest.mark.slow
def test_demo_without_the_admin_password_says_401_and_fails(
    compose_gateway: _Mapped,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in [k for k in os.environ if k.startswith("RABBITFLOW_")]:
        monkeypatch.delenv(key)

    code = main(_demo_argv(compose_gateway))

    captured = capsys.readouterr()
    assert code == 1
    assert "HTTP 401" in captured.err
    assert "--admin-password" in captured.err
    assert "peak depth" not in captured.out
