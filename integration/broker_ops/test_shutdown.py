"""Stopping the gateway: SIGTERM drains and closes with 320, upstream refusal is 320.

The gateway runs as a real ``rabbitflow-broker`` process, stopped with
SIGTERM and started again on the same port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

import rabbitflow
from integration.broker.conftest import wait_for
from integration.client._support import Sender, drain, numbers
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
#: The producer's stream: the SIGTERM comes with its window (100) full and
#: thousands still to send (checked: stopped_at < TOTAL); a longer stream
#: adds nothing but time.
TOTAL = 6_000
SIGTERM_AFTER = 2_000


class GatewayProcess:
    """``rabbitflow-broker`` on a fixed port; start, SIGTERM and start again."""

    def __init__(self, broker: Broker, log_dir: Path, *extra: str) -> None:
        self.broker = broker
        self.port = free_port()
        self.admin_port = free_port()
        self.log_dir = log_dir
        self.extra = extra
        self.process: subprocess.Popen[str] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def log(self) -> Path:
        return self.log_dir / f"gateway-{self.starts}.log"

    def start(self, *, wait_ready: bool = True) -> None:
        self.starts += 1
        environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
        with open(self.log, "w") as stderr:
            self.process = subprocess.Popen(
                [
                    BROKER_CLI,
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--admin-listen",
                    f"127.0.0.1:{self.admin_port}",
                    "--upstream",
                    self.broker.url,
                    "--management-url",
                    self.broker.management_url or "http://127.0.0.1:15672",
                    *self.extra,
                ],
                stderr=stderr,
                text=True,
                env=environ,
            )
        if wait_ready:
            log = self.log
            wait_for(
                lambda: (
                    "gateway listening" in log.read_text() and "gateway ready" in log.read_text()
                ),
                timeout=30,
                what="gateway listening and ready",
            )

    def terminate(self) -> int:
        """SIGTERM; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


@pytest.fixture
def gateway_process(broker: Broker, tmp_path: Path) -> Iterator[GatewayProcess]:
    running = GatewayProcess(broker, tmp_path)
    running.start()
    yield running
    running.kill()


def _delete_queue(url: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_delete(queue)
    finally:
        connection.close()


def _use_until_closed(
    connection: pika.BlockingConnection, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    """Keep using the connection; pika raises once it reads the gateway's Connection.Close."""
    deadline = time.monotonic() + 30
    while connection.is_open and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
        channel.basic_qos(prefetch_count=1)


def test_sigterm_closes_clients_with_320_gateway_shutting_down_and_exits_0(
    gateway_process: GatewayProcess,
) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(gateway_process.url))
    channel = connection.channel()

    status = gateway_process.terminate()

    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        _use_until_closed(connection, channel)
    assert closed.value.reply_code == 320
    assert "gateway shutting down" in closed.value.reply_text
    assert status == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sdk_producer_loses_duplicates_and_reorders_nothing_across_sigterm_and_restart(
    gateway_process: GatewayProcess, broker: Broker
) -> None:
    queue = f"rf-sigterm-{uuid.uuid4().hex[:10]}"
    factory = rabbitflow.ConnectionFactory(gateway_process.url)
    try:
        with factory.create_connection() as connection:
            session = connection.create_session()
            producer = session.create_producer(session.create_queue(queue), capacity=100)
            sender = Sender(producer, session, range(1, TOTAL + 1))
            sender.start()
            wait_for(
                lambda: sender.returned >= SIGTERM_AFTER or not sender.is_alive(),
                timeout=120,
                what=f"{SIGTERM_AFTER} sends",
            )
            assert sender.is_alive(), f"sender ended early: {sender.error!r}"
            status = gateway_process.terminate()
            stopped_at = sender.returned
            gateway_process.start()
            sender.join(timeout=300)
            assert not sender.is_alive(), "the producer did not finish after the restart"
            assert sender.error is None, repr(sender.error)
            producer.close()  # waits for the outstanding confirms
            resent = producer.resent_count
        ids = numbers(drain(broker.url, queue))
    finally:
        _delete_queue(broker.url, queue)

    assert status == 0
    assert stopped_at < TOTAL, "the SIGTERM came after the stream ended"
    missing = sorted(set(range(1, TOTAL + 1)) - set(ids))
    assert not missing, f"{len(missing)} messages lost, first {missing[:10]}"
    duplicates = {n: c for n, c in Counter(ids).items() if c > 1}
    assert not duplicates, f"{len(duplicates)} duplicated ids ({resent} re-sent unconfirmed)"
    assert ids == list(range(1, TOTAL + 1)), "messages were reordered"


def test_upstream_refusal_reaches_the_client_as_320_with_the_cause(
    broker: Broker, tmp_path: Path
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    nowhere = Broker(f"amqp://guest:guest@127.0.0.1:{dead_port}/%2F", broker.management_url)
    gateway = GatewayProcess(nowhere, tmp_path)
    gateway.start()
    try:
        # pika reports a Connection.Close that comes before Connection.Start as an
        # IncompatibleProtocolError carrying the close; either way the code and
        # text must reach the client.
        with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
            pika.BlockingConnection(pika.URLParameters(gateway.url + "?connection_attempts=1"))
    finally:
        gateway.kill()

    text = str(refused.value)
    assert "(320)" in text, text
    assert "upstream unreachable" in text, text
    assert "refused" in text.lower(), text
