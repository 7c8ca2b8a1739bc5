"""Admin API credentials (issue 4, point 6): loopback by default, credentials elsewhere."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from integration.broker.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))


def _non_loopback_ip() -> str:
    """This machine's first non-loopback IPv4 address (``hostname -I``), else 127.0.0.1."""
    try:
        out = subprocess.run(
            ["hostname", "-I"], check=False, capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "127.0.0.1"
    for address in out.split():
        if "." in address and not address.startswith("127."):
            return address
    return "127.0.0.1"


def _status(url: str, user: str | None = None, password: str = "") -> int:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _broker_args(broker: Broker) -> list[str]:
    return [
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--upstream",
        broker.url,
        "--management-url",
        broker.management_url or "http://127.0.0.1:15672",
    ]


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}


def test_non_loopback_admin_without_credentials_refuses_to_start(broker: Broker) -> None:
    result = subprocess.run(
        [BROKER_CLI, *_broker_args(broker), "--admin-listen", f"0.0.0.0:{free_port()}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=_environ(),
    )

    assert result.returncode != 0
    assert "--admin-users" in result.stderr, result.stderr


@pytest.fixture
def exposed_gateway(broker: Broker, tmp_path: Path) -> Iterator[str]:
    """A ``rabbitflow-broker`` process with its admin API on 0.0.0.0 and one user."""
    port = free_port()
    log = tmp_path / "stderr.log"
    stderr = log.open("w")
    process = subprocess.Popen(
        [
            BROKER_CLI,
            *_broker_args(broker),
            "--admin-listen",
            f"0.0.0.0:{port}",
            "--admin-users",
            "alice:s3cret",
            "--state-file",
            str(tmp_path / "state.json"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=_environ(),
    )
    url = f"http://{_non_loopback_ip()}:{port}"

    def answering() -> bool:
        if process.poll() is not None:
            pytest.fail(f"gateway exited: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_for(answering, timeout=30, interval=0.1, what="the admin API to listen")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        stderr.close()


def test_exposed_admin_api_refuses_missing_credentials(exposed_gateway: str) -> None:
    assert _status(exposed_gateway + "/api/queues") == 401


def test_exposed_admin_api_refuses_wrong_credentials(exposed_gateway: str) -> None:
    assert _status(exposed_gateway + "/api/queues", "alice", "wrong") == 401


def test_exposed_admin_api_accepts_the_configured_user(exposed_gateway: str) -> None:
    assert _status(exposed_gateway + "/api/queues", "alice", "s3cret") == 200


def test_rabbitmq_auth_accepts_rabbitmq_users_and_refuses_others(
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    gateway = gateway_factory(admin_auth="rabbitmq")
    url = f"http://127.0.0.1:{gateway.admin_port}/api/queues"

    assert _status(url, "guest", "guest") == 200
    assert _status(url, "guest", "not-the-password") == 401
    assert _status(url) == 401
