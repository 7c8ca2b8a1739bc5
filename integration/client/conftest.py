"""Fixtures of the client integration tests: a real gateway in front of the
shared RabbitMQ, run as ``rabbitflow-broker`` is run by an operator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rabbitflow_broker.rabbitmq_node import free_port, wait_for_amqp

from ..conftest import Broker


@pytest.fixture
def gateway_url(broker: Broker, tmp_path: Path) -> Iterator[str]:
    """The AMQP URL of a gateway (its own process) in front of ``broker``."""
    if broker.management_url is None:
        pytest.skip("the gateway needs the management API")
    port = free_port()
    log = (tmp_path / "gateway.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rabbitflow_broker.cli",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{free_port()}",
            "--upstream",
            broker.url,
            "--management-url",
            broker.management_url,
            "--state-file",
            str(tmp_path / "gateway-state.json"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        wait_for_amqp("127.0.0.1", port, 30)
        yield f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    finally:
        process.terminate()
        process.wait(10)
        log.close()
