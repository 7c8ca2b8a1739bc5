"""The producer against the rabbitflow gateway: Channel.Flow holds send(),
depth stays within stop threshold + capacity, and the unflow resumes it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pika
import pytest

import rabbitflow


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
        received: list[int] = []
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
