"""Connection loss over the fake transport: re-declare, re-send, give up."""

from collections.abc import Callable

import rabbitflow
from rabbitflow._connection import reconnect_strategy
from rabbitflow._properties import ClientConfig

from .fakes import make_harness


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    import threading

    event = threading.Event()
    for _ in range(500):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_unconfirmed_messages_are_resent_after_reconnection() -> None:
    harness = make_harness()
    connection = harness.factory.create_connection()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("orders"), capacity=5)
    for n in (b"1", b"2", b"3"):
        producer.send(session.create_bytes_message(n))
    harness.transport.channels[-1].emit_ack(1)
    first = harness.transport
    first.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert harness.transport is not first
    assert [p.body for p in harness.broker.published] == [b"1", b"2", b"3", b"2", b"3"]
    assert producer.resent_count == 2
    assert producer.resent_unconfirmed_count == 2


def test_recovery_redeclares_the_session_queues() -> None:
    harness = make_harness()
    connection = harness.factory.create_connection()
    connection.create_session().create_queue("orders")
    harness.broker.queues.clear()  # a restarted broker without the queue
    harness.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert "orders" in harness.broker.queues


def test_gives_up_after_the_configured_attempts_and_tells_the_listener() -> None:
    harness = make_harness({"rabbitflow.reconnect_attempts": 3})
    connection = harness.factory.create_connection()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("orders"))
    errors: list[rabbitflow.JMSException] = []
    connection.set_exception_listener(errors.append)
    failing = harness.factory._transport_factory

    def refuse(*args: object, **kwargs: object) -> object:
        transport = failing(*args, **kwargs)  # type: ignore[arg-type]
        transport.fail_connect = rabbitflow.ConnectionLostError("refused")  # type: ignore[attr-defined]
        return transport

    connection._transport_factory = refuse  # type: ignore[assignment]
    harness.transport.emit_lost()
    wait_for(lambda: bool(errors), "the exception listener")
    assert isinstance(errors[0], rabbitflow.ConnectionLostError)
    assert "3 attempt" in str(errors[0])
    assert len(harness.sleeps) == 2
    try:
        producer.send(session.create_text_message("x"))
    except rabbitflow.ConnectionLostError:
        pass
    else:
        raise AssertionError("send after recovery gave up did not raise")


def test_strategy_waits_grow_up_to_the_maximum() -> None:
    sleeps: list[float] = []
    config = ClientConfig(
        reconnect_attempts=6, reconnect_initial_delay_ms=100, reconnect_max_delay_ms=400
    )
    strategy = reconnect_strategy(config, sleep=sleeps.append)
    try:
        for attempt in strategy:
            with attempt:
                raise rabbitflow.ConnectionLostError("down")
    except rabbitflow.ConnectionLostError:
        pass
    assert len(sleeps) == 5
    assert all(0 < s <= 0.4 + 0.1 for s in sleeps)
