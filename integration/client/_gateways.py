"""Gateway processes that a test can kill and start again on the same port."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pika.exceptions

from rabbitflow_broker.server.rabbitmq_node import free_port

from ..conftest import Broker


class GatewayProcess:
    """A gateway process in front of ``broker`` on a fixed port."""

    def __init__(self, broker: Broker, tmp_path: Path, name: str = "gateway") -> None:
        assert broker.management_url is not None, "the gateway needs the management API"
        self.port = free_port()
        self.name = name
        self._broker = broker
        self._tmp = tmp_path
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path = tmp_path / f"{name}.log"
        self._log = self.log_path.open("ab")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        assert self._broker.management_url is not None
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rabbitflow_broker.cli",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                self._broker.url,
                "--management-url",
                self._broker.management_url,
                "--state-file",
                str(self._tmp / f"{self.name}-state.json"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        # The gateway refuses logins until its first routing snapshot.
        deadline = time.monotonic() + 30
        while True:
            if not self.running:
                raise AssertionError(
                    f"{self.name} exited while starting: {self.log_path.read_text()[-2000:]}"
                )
            try:
                pika.BlockingConnection(pika.URLParameters(self.url)).close()
                return
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients or to RabbitMQ."""
        assert self._process is not None
        self._process.send_signal(signal.SIGKILL)
        self._process.wait(10)

    def close(self) -> None:
        if self.running:
            assert self._process is not None
            self._process.terminate()
            self._process.wait(10)
        self._log.close()


@contextmanager
def gateways(broker: Broker, tmp_path: Path, count: int) -> Iterator[list[GatewayProcess]]:
    """``count`` started gateways in front of ``broker``, stopped at the end
    (their logs go to stderr, which pytest shows for a failed test)."""
    started: list[GatewayProcess] = []
    try:
        for n in range(count):
            gateway = GatewayProcess(broker, tmp_path, f"gateway{n + 1}")
            started.append(gateway)
            gateway.start()
        yield started
    finally:
        for gateway in started:
            gateway.close()
            sys.stderr.write(f"--- {gateway.name} log ---\n{gateway.log_path.read_text()}")


def require_management(broker: Broker, fail: Callable[[str], object]) -> None:
    """Fail (never skip) when the gateway cannot run."""
    if broker.management_url is None:
        fail("the gateway needs RabbitMQ's management API: set RABBITMQ_MANAGEMENT_URL")
