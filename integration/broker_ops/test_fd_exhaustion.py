"""Running out of file descriptors is logged as such, not as an upstream outage."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from integration.broker.conftest import serving, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
#: Enough for the gateway to start, far too few for the clients below.
FD_LIMIT = 64
CLIENTS = 80


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("pacing", ["burst", "one_at_a_time"])
def test_fd_exhaustion_is_logged_as_too_many_open_files(
    broker: Broker, tmp_path: Path, pacing: str
) -> None:
    """In a burst the upstream connections find no descriptor; one at a time,
    each client's pair is open before the next arrives, so the last descriptor
    goes to an upstream socket and the next accept is what fails (which uvloop
    does not report): both are logged."""
    port = free_port()
    log = tmp_path / "gateway.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                BROKER_CLI,
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url or "http://127.0.0.1:15672",
            ],
            stderr=stderr,
            env=environ,
            preexec_fn=_limit_fds,  # noqa: PLW1509 (only setrlimit, before exec)
        )
    clients: list[socket.socket] = []
    try:
        wait_for(lambda: serving(log), timeout=30, what="gateway ready and listening")
        for _ in range(CLIENTS):
            before = _open_fds(process.pid)
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
            if pacing == "one_at_a_time":
                if "too many open files" in log.read_text().lower():
                    break
                # The client's socket and its upstream socket, or a refusal.
                wait_for(
                    lambda: (
                        _open_fds(process.pid) >= before + 2  # noqa: B023
                        or "too many open files" in log.read_text().lower()
                    ),
                    timeout=10,
                    what="the gateway to take the client and open its upstream",
                )
        wait_for(
            lambda: "too many open files" in log.read_text().lower(),
            timeout=30,
            what="a 'too many open files' line",
        )
    finally:
        for client in clients:
            client.close()
        process.terminate()
        process.wait(30)

    text = log.read_text()
    assert not any(
        "upstream unreachable" in line and "Too many open files" in line
        for line in text.splitlines()
    ), text
