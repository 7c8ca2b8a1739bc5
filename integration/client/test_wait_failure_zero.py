"""``qpid.flow_control_wait_failure=0`` raises at once only under flow control.

A window that is merely full waits for its confirms (direct to RabbitMQ,
where nothing flow-controls); a channel the gateway has flowed makes the
next send raise at once, and that message is not enqueued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pika
import pytest

import rabbitflow

from ..conftest import Broker
from ._support import CLIENT_LOGGER, QueueCollector, drain, numbers, wait_until

_WAIT_EVENTS = {"send_delayed", "send_failed"}


def _wait_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == CLIENT_LOGGER and r.__dict__.get("flow_event") in _WAIT_EVENTS
    ]


def test_a_full_window_never_reports_flow_control(
    broker: Broker,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    name = new_queue("wf0")
    factory = rabbitflow.ConnectionFactory(
        broker.url, properties={"qpid.flow_control_wait_failure": 0}
    )
    with factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(name), capacity=5)
        for n in range(1, 3001):
            producer.send(
                session.create_text_message(str(n)), delivery_mode=rabbitflow.NON_PERSISTENT
            )
        wait_until(lambda: producer.unconfirmed_count == 0, 30, "every confirm")
        producer.close()
    assert _wait_records(caplog) == []
    assert numbers(drain(broker.url, name)) == list(range(1, 3001))


def test_a_flowed_channel_raises_at_once_and_enqueues_nothing(
    broker: Broker,
    gateway_url: str,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    name = new_queue("wf0gw")
    declarer = pika.BlockingConnection(pika.URLParameters(gateway_url))
    declarer.channel().queue_declare(
        name, durable=True, arguments={"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}
    )
    declarer.close()
    factory = rabbitflow.ConnectionFactory(
        gateway_url, properties={"qpid.flow_control_wait_failure": 0}
    )
    with factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(name), capacity=5)
        sent = 0
        failure: rabbitflow.FlowControlTimeoutError | None = None
        for n in range(1, 101):
            try:
                producer.send(session.create_text_message(str(n)))
            except rabbitflow.FlowControlTimeoutError as exc:
                failure = exc
                break
            sent = n
        assert failure is not None, "send() never raised on the flowed channel"
        assert str(failure) == (
            "Unable to send message for 0 seconds due to broker enforced flow control"
        )
        assert producer.flow_state == "flowed"
        # The producer honours the flow: a message accepted just before the
        # flow arrived waits in it, unpublished, until the gateway unflows the
        # channel.  A consumer empties the queue, the gateway learns the depth
        # from RabbitMQ and unflows; then every accepted message is confirmed.
        collector = QueueCollector(broker.url, name).start()
        try:
            wait_until(
                lambda: producer.flow_state == "open", 30, "the gateway to unflow the channel"
            )
            wait_until(lambda: producer.unconfirmed_count == 0, 30, "every confirm")
            wait_until(lambda: collector.count >= sent, 30, f"{sent} messages consumed")
        finally:
            bodies = collector.stop()
        # Everything accepted reached RabbitMQ once, in order; the refused message did not.
        assert numbers(bodies + drain(broker.url, name)) == list(range(1, sent + 1))
        producer.close()
    assert [r.__dict__["flow_event"] for r in _wait_records(caplog)] == ["send_failed"]
    assert 10 <= sent <= 15, "the queue stops at its threshold, plus at most one window"
