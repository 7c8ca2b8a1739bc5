"""send() under RabbitMQ's memory alarm (connection.blocked), issue 2 item 2.

A throwaway node is put into a memory alarm with
``rabbitmqctl set_vm_memory_high_watermark 0.0000001``; RabbitMQ then
blocks publishing connections and tells them with ``connection.blocked``.
A producer sending on a background thread must stop returning from
``send()`` and log the "delayed" warnings; when the watermark is restored
it must finish, and the queue must hold every message once, in order.
The same holds through the gateway, which relays ``connection.blocked``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

import rabbitflow

from ..conftest import Broker
from ._gateways import GatewayProcess
from ._support import (
    Sender,
    clear_memory_alarm,
    client_messages,
    drain,
    memory_alarm_active,
    numbers,
    set_memory_alarm,
    wait_until,
)

BEFORE_ALARM = 20
TOTAL = 200


def _delayed(seconds: int) -> str:
    return f"Message send delayed by {seconds}s due to broker enforced flow control"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["direct", "through the gateway"])
def test_send_blocks_during_a_memory_alarm_and_resumes_without_loss(
    throwaway_broker: Broker,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    path: str,
) -> None:
    node = throwaway_broker.node
    assert node is not None
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    queue = unique_name("alarm")
    url = throwaway_broker.url
    stack = contextlib.ExitStack()
    if path != "direct":
        with contextlib.ExitStack() as starting:  # closed if the start fails
            gateway = starting.enter_context(
                contextlib.closing(GatewayProcess(throwaway_broker, tmp_path))
            )
            gateway.start()
            stack.push(starting.pop_all())
        url = gateway.url
    factory = rabbitflow.ConnectionFactory(
        url,
        properties={
            "qpid.flow_control_wait_notify_period": 1000,
            "qpid.flow_control_wait_failure": 120000,
        },
    )
    with stack, factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=10)
        for n in range(1, BEFORE_ALARM + 1):
            producer.send(session.create_text_message(str(n)))

        set_memory_alarm(node)
        try:
            wait_until(lambda: memory_alarm_active(node), 30, "the memory alarm")
            sender = Sender(producer, session, range(BEFORE_ALARM + 1, TOTAL + 1))
            sender.start()
            wait_until(
                lambda: any(
                    _delayed(1) in m for m in client_messages(caplog.records, logging.WARNING)
                ),
                30,
                "the 1s 'delayed' warning",
            )
            returned_at_1s = sender.returned
            wait_until(
                lambda: any(
                    _delayed(2) in m for m in client_messages(caplog.records, logging.WARNING)
                ),
                30,
                "the 2s 'delayed' warning",
            )
            returned_at_2s = sender.returned
            still_blocked = sender.is_alive()
        finally:
            clear_memory_alarm(node)

        # No send returned while the alarm held the connection blocked.
        assert still_blocked
        assert returned_at_1s == returned_at_2s < TOTAL - BEFORE_ALARM
        sender.join(timeout=120)
        assert not sender.is_alive(), "send() did not resume after the alarm cleared"
        assert sender.error is None, repr(sender.error)
        assert sender.returned == TOTAL - BEFORE_ALARM

    assert numbers(drain(throwaway_broker.url, queue)) == list(range(1, TOTAL + 1))
