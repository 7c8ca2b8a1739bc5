"""Several broker URLs over the fake transports, for both drivers: connecting
skips a broker that is down, recovery moves round robin to the next one,
and what was unconfirmed is re-sent there flagged as redelivered."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

import rabbitflow
from rabbitflow._message import REDELIVERED_HEADER, Message, WireProperties

from .aio_fakes import Broker, fake_factory
from .fakes import make_harness

A, B, C = "amqp://a/", "amqp://b/", "amqp://c/"
FAST = {"rabbitflow.reconnect_initial_delay": 10, "rabbitflow.reconnect_max_delay": 20}


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        event.wait(0.01)


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def _flagged(props: WireProperties) -> bool:
    return (props.headers or {}).get(REDELIVERED_HEADER) is True


# ------------------------------------------------------------------- sync
def test_connecting_skips_a_broker_that_is_down() -> None:
    harness = make_harness(url=[A, B, C], down={A})
    connection = harness.factory.create_connection()
    assert [t.url for t in harness.broker.transports] == [A, B]
    assert harness.broker.transports[0].closing  # the failed attempt is cleaned up
    assert connection.url == B
    assert connection.urls == (A, B, C)


def test_connecting_fails_naming_every_url_when_all_are_down() -> None:
    harness = make_harness(url=[A, B], down={A, B})
    with pytest.raises(rabbitflow.ConnectionLostError, match="none of 2 broker URLs") as caught:
        harness.factory.create_connection()
    assert "amqp://a/" in str(caught.value)
    assert "amqp://b/" in str(caught.value)


def test_recovery_tries_the_next_url_round_robin_with_the_backoff() -> None:
    down: set[str] = set()
    harness = make_harness(FAST, url=[A, B, C], down=down)
    connection = harness.factory.create_connection()
    down |= {B}  # the next one is down too: recovery goes on to C
    harness.transport.emit_lost()
    _wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert [t.url for t in harness.broker.transports] == [A, B, C]
    assert connection.url == C
    assert len(harness.sleeps) == 1  # one backoff between the two attempts
    down.clear()
    harness.transport.emit_lost()
    _wait_for(lambda: connection.reconnect_count == 2, "the second reconnection")
    assert harness.transport.url == A  # round robin: after C comes A


def test_a_producer_resends_its_unconfirmed_messages_to_the_next_broker_flagged() -> None:
    harness = make_harness(FAST, url=[A, B])
    connection = harness.factory.create_connection()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("orders"), capacity=5)
    for body in (b"1", b"2", b"3"):
        producer.send(session.create_bytes_message(body))
    harness.transport.channels[-1].emit_ack(1)
    harness.transport.emit_lost()
    _wait_for(lambda: connection.reconnect_count == 1, "the failover")
    assert harness.transport.url == B
    published = harness.broker.published
    assert [p.body for p in published] == [b"1", b"2", b"3", b"2", b"3"]
    assert [_flagged(p.props) for p in published] == [False, False, False, True, True]
    producer.send(session.create_bytes_message(b"4"))  # new sends are not flagged
    assert published[-1].body == b"4"
    assert not _flagged(published[-1].props)
    harness.transport.channels[-1].emit_ack(3, multiple=True)
    assert producer.unconfirmed_count == 0
    connection.close()


def test_a_flagged_message_is_received_as_redelivered() -> None:
    props = WireProperties(content_type="text/plain", headers={REDELIVERED_HEADER: True})
    message = Message.from_wire(b"x", props, redelivered=False, destination=None)
    assert message.redelivered
    assert REDELIVERED_HEADER not in message.properties
    plain = Message.from_wire(b"x", WireProperties(), redelivered=False, destination=None)
    assert not plain.redelivered


# ------------------------------------------------------------------ asyncio
@pytest.mark.asyncio
async def test_aio_connecting_skips_a_broker_that_is_down() -> None:
    broker = Broker(queues={"orders"}, down={A})
    connection = await fake_factory(broker, FAST, url=[A, B]).create_connection()
    assert [t.url for t in broker.transports] == [A, B]
    assert broker.transports[0].closing
    assert connection.url == B
    await connection.close()


@pytest.mark.asyncio
async def test_aio_connecting_fails_naming_every_url_when_all_are_down() -> None:
    broker = Broker(down={A, B})
    with pytest.raises(rabbitflow.ConnectionLostError, match="none of 2 broker URLs"):
        await fake_factory(broker, FAST, url=f"failover:({A},{B})").create_connection()


@pytest.mark.asyncio
async def test_aio_producer_fails_over_round_robin_and_resends_flagged() -> None:
    broker = Broker(queues={"orders"})
    connection = await fake_factory(broker, FAST, url=[A, B, C]).create_connection()
    session = connection.create_session()
    producer = await session.create_producer(await session.create_queue("orders"), capacity=5)
    for body in (b"1", b"2", b"3"):
        await producer.send(session.create_bytes_message(body))
    await _until(lambda: len(broker.published) == 3, "the publishes")
    broker.transports[-1].channels[-1].emit_ack(1)
    broker.down.add(B)
    broker.transports[-1].emit_lost()
    await _until(lambda: connection.reconnect_count == 1, "the failover")
    assert [t.url for t in broker.transports] == [A, B, C]
    assert connection.url == C
    await _until(lambda: len(broker.published) == 5, "the re-sends")
    assert [body for _, body in broker.published] == [b"1", b"2", b"3", b"2", b"3"]
    assert [_flagged(p) for p in broker.props] == [False, False, False, True, True]
    broker.transports[-1].channels[-1].emit_ack(2, multiple=True)
    await connection.close()
