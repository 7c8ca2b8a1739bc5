"""The producer against the rabbitflow gateway: Channel.Flow holds send(),
depth stays within stop threshold + capacity, and the unflow resumes it."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

import rabbitflow
from rabbitflow_broker.rabbitmq_node import free_port, wait_for_amqp

from ..conftest import Broker


@pytest.fixture
def gateway_url(broker: Broker, tmp_path: Path) -> Iterator[str]:
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


def test_channel_flow_holds_send_until_the_queue_drains(
    gateway_url: str,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rabbitflow.client")
    name = unique_name("gw")
    cleanup_queues.append(name)
    factory = rabbitflow.ConnectionFactory(
        gateway_url,
        properties={
            "qpid.flow_control_wait_failure": 3000,
            "qpid.flow_control_wait_notify_period": 1000,
        },
    )
    with factory.create_connection() as connection:
        admin = connection.create_session()
        # Declared through the gateway with its thresholds, before the SDK uses it.
        declarer = pika.BlockingConnection(pika.URLParameters(gateway_url))
        declarer.channel().queue_declare(
            name, durable=True, arguments={"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}
        )
        declarer.close()
        queue = admin.create_queue(name)
        producer = admin.create_producer(queue, capacity=5)
        sent = 0
        failure: rabbitflow.JMSException | None = None
        for n in range(1, 41):
            try:
                producer.send(admin.create_text_message(str(n)))
            except rabbitflow.FlowControlTimeoutError as exc:
                failure = exc
                break
            sent = n
        assert failure is not None, "send() never gave up under flow control"
        assert producer.flow_state == "flowed"
        assert 10 < sent <= 15, "depth must stay within stop threshold + capacity"

        consumer = admin.create_consumer(queue)
        connection.start()
        received = []
        while len(received) < sent:
            message = consumer.receive(timeout=10)
            assert isinstance(message, rabbitflow.TextMessage), f"got {received}"
            received.append(int(message.text))
        assert received == list(range(1, sent + 1))
        producer.send(admin.create_text_message("after"))  # unflowed again
        producer.close()
    events = [r.__dict__.get("flow_event") for r in caplog.records if r.name == "rabbitflow.client"]
    assert events.index("flow_enforced") < events.index("send_failed")
    assert "flow_removed" in events
