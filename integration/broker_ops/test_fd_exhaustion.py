"""Running out of file descriptors is logged as such, not as an upstream outage."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

from integration.broker.conftest import wait_for
from integration.conftest import Broker
from rabbitflow_broker.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
#: Enough for the gateway to start, far too few for the clients below.
FD_LIMIT = 64
CLIENTS = 80


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_fd_exhaustion_is_logged_as_too_many_open_files(broker: Broker, tmp_path: Path) -> None:
    """A burst of clients. (One at a time, so that the last descriptor goes to
    an upstream socket and uvloop drops the next client silently, is left to
    DescriptorWatch's unit tests: run here, about one run in ten on a loaded
    machine met a connect refused by a gateway that said it was listening, a
    fault not understood yet.)"""
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
        wait_for(lambda: "gateway ready" in log.read_text(), timeout=30, what="gateway ready")
        for _ in range(CLIENTS):
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
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
