"""docker-compose.yml, the Dockerfile and .dockerignore, read as files (no Docker
engine needed): healthchecks, a required admin password, RabbitMQ's AMQP port
kept private, and an image that runs the installed wheel as a non-root user."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rabbitflow_broker.server import healthcheck

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _container_port(mapping: str | dict[str, Any]) -> int:
    """The container side of a compose port mapping (short or long syntax)."""
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).split(":")[-1].split("/")[0])


def test_rabbitmq_amqp_port_is_not_published() -> None:
    published = {
        (name, _container_port(port))
        for name, service in SERVICES.items()
        for port in service.get("ports", [])
    }

    assert ("rabbitmq", 5672) not in published
    assert ("gateway", 5673) in published


def test_rabbitmq_management_is_published_on_loopback_only() -> None:
    ports = SERVICES["rabbitmq"].get("ports", [])

    assert all(str(port).startswith("127.0.0.1:") for port in ports)


def test_the_admin_password_has_no_default() -> None:
    uses = re.findall(r"\$\{RABBITFLOW_ADMIN_PASSWORD([^}]*)\}", COMPOSE_TEXT)

    # The gateway's admin users, the demo's password, the cluster profile's gateways.
    assert len(uses) == 3
    assert all(use.startswith(":?") for use in uses), uses
    assert "change-me" not in COMPOSE_TEXT


def test_the_gateway_and_rabbitmq_have_healthchecks() -> None:
    for name in ("rabbitmq", "gateway"):
        check = SERVICES[name]["healthcheck"]
        assert check["test"][0] == "CMD"
        assert check["retries"] >= 3
    assert SERVICES["gateway"]["healthcheck"]["test"][1:4] == [
        "python",
        "-m",
        "rabbitflow_broker.server.healthcheck",
    ]


def test_services_wait_for_the_health_of_what_they_use() -> None:
    assert SERVICES["gateway"]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    assert SERVICES["demo"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert any(arg.startswith("--wait=") for arg in SERVICES["demo"]["command"])


def test_the_gateway_serves_every_interface_in_its_container() -> None:
    assert "--listen=0.0.0.0:5673" in SERVICES["gateway"]["command"]
    assert "ENV RABBITFLOW_BROKER_LISTEN=0.0.0.0:5673" in DOCKERFILE


CLUSTER = ("gateway-1", "gateway-2")


def test_the_cluster_profile_runs_two_members_of_one_cluster() -> None:
    commands = [SERVICES[name]["command"] for name in CLUSTER]
    clusters = [{arg for arg in command if arg.startswith("--cluster=")} for command in commands]
    assert clusters == [{"--cluster=compose"}] * 2
    for name in CLUSTER:
        service = SERVICES[name]
        assert service["profiles"] == ["cluster"]
        assert service["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
        assert service["healthcheck"] == SERVICES["gateway"]["healthcheck"]
        assert "--listen=0.0.0.0:5673" in service["command"]
        assert service["environment"]["RABBITFLOW_BROKER_ADMIN_USERS"].startswith("admin:${")
    # Each has its own event log and its own host ports, none of the default gateway's.
    assert len({tuple(SERVICES[name]["volumes"]) for name in CLUSTER}) == 2
    host_ports = [
        str(port).split(":")[0]
        for name in ("gateway", *CLUSTER)
        for port in SERVICES[name]["ports"]
    ]
    assert len(host_ports) == len(set(host_ports)) == 6
    # The default services still start without the profile.
    assert "profiles" not in SERVICES["gateway"]
    assert "profiles" not in SERVICES["rabbitmq"]


def test_the_image_is_multi_stage_non_root_with_a_healthcheck() -> None:
    stages = re.findall(r"^FROM .*$", DOCKERFILE, flags=re.MULTILINE)
    assert len(stages) == 2
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert users
    assert users[-1] not in ("root", "0")
    healthcheck_command = r"^HEALTHCHECK .*\n\s+CMD .*rabbitflow_broker\.server\.healthcheck"
    assert re.search(healthcheck_command, DOCKERFILE, re.M)
    # The final stage installs the built wheel, not the sources in place.
    final = DOCKERFILE.rpartition(stages[-1])[2]
    assert "pip install -e" not in DOCKERFILE
    assert "COPY broker_plugin" not in final
    assert '--find-links /wheels "rabbitflow[broker]"' in final


def test_dockerignore_keeps_the_virtualenv_and_git_out() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]

    assert {".venv", ".git", "**/*.so"} <= set(ignored)
    for needed in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "client"):
        assert needed not in ignored
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, flags=re.MULTILINE):
        for source in copied.split():
            assert (ROOT / source).exists(), source


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, ("127.0.0.1", 5673)),
        ([], {"RABBITFLOW_BROKER_LISTEN": "0.0.0.0:6000"}, ("127.0.0.1", 6000)),
        (["[::]:6001"], {}, ("::1", 6001)),
        (["10.0.0.5:5673"], {"RABBITFLOW_BROKER_LISTEN": "0.0.0.0:6000"}, ("10.0.0.5", 5673)),
    ],
)
def test_healthcheck_probes_the_listen_address_on_loopback(
    argv: list[str], environ: dict[str, str], expected: tuple[str, int]
) -> None:
    assert healthcheck.probe_address(argv, environ) == expected


@pytest.fixture
def amqp_answerer() -> Iterator[int]:
    """A port answering the AMQP header with a method frame on channel 0."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(8)
                conn.sendall(b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xce")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_healthcheck_exit_status(amqp_answerer: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert healthcheck.main([f"127.0.0.1:{amqp_answerer}"], {}) == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert healthcheck.main([f"127.0.0.1:{closed}"], {}) == 1
    assert healthcheck.main(["no-port"], {}) == 2
    assert "no AMQP answer" in capsys.readouterr().err
