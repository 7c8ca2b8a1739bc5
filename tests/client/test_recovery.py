"""Connection loss over the fake transport: re-declare, re-send, give up."""

from collections.abc import Callable

import pytest

import rabbitflow
from rabbitflow._connection import reconnect_strategy
from rabbitflow._properties import ClientConfig

from .fakes import (
    FakeChannel,
    Harness,
    harness_session,
    lose_and_recover,
    make_harness,
    wait_for,
)


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
    harness.broker.refusing = True
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


def _producers(
    harness: Harness, count: int, capacity: int = 10
) -> tuple[rabbitflow.Connection, list[tuple[rabbitflow.Session, rabbitflow.MessageProducer]]]:
    connection = harness.factory.create_connection()
    pairs = []
    for n in range(count):
        session = connection.create_session()
        harness.broker.queues[f"q{n}"] = {}
        pairs.append(
            (session, session.create_producer(session.create_queue(f"q{n}"), capacity=capacity))
        )
    return connection, pairs


def test_a_loss_while_restoring_a_session_resends_everything_on_the_next_attempt() -> None:
    harness = make_harness()
    connection, pairs = _producers(harness, 3)
    for session, producer in pairs:
        for n in (b"1", b"2"):
            producer.send(session.create_bytes_message(n))
    # The reconnection dies at its 4th channel open: session 1 (admin +
    # producer channel) is restored and has re-sent, session 2 is not.
    harness.broker.lose_at_channel_open[1] = 4
    harness.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert len(harness.broker.transports) == 3
    last = harness.broker.transports[2]
    for n, (_, producer) in enumerate(pairs):
        resent = [p for p in harness.broker.published if p.routing_key == f"q{n}"][-2:]
        assert [p.body for p in resent] == [b"1", b"2"]
        assert [p.tag for p in resent] == [1, 2]  # fresh confirm tags on the new channel
        assert producer.flow_state == "open"
    # Confirms of the last transport's channels complete every producer.
    for channel in last.channels:
        if channel.confirming:
            channel.emit_ack(2, multiple=True)
    assert [producer.unconfirmed_count for _, producer in pairs] == [0, 0, 0]


def test_a_loss_at_the_first_publish_of_a_reconnection_loses_nothing() -> None:
    harness = make_harness()
    connection, pairs = _producers(harness, 2)
    session, producer = pairs[0]
    for n in (b"1", b"2", b"3"):
        producer.send(session.create_bytes_message(n))
    harness.broker.lose_at_first_publish.add(1)
    harness.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    wait_for(lambda: producer.flow_state == "open", "the producer to reopen")
    bodies = [p.body for p in harness.broker.published if p.routing_key == "q0"]
    assert bodies[-3:] == [b"1", b"2", b"3"]
    producer_channel = next(c for c in harness.transport.channels if c.handler is producer)
    producer_channel.emit_ack(3, multiple=True)
    assert producer.unconfirmed_count == 0


def test_a_producer_reattached_on_a_connection_blocked_during_restore_comes_back_blocked() -> None:
    harness = make_harness()
    connection, pairs = _producers(harness, 2)
    (_, attached), (session, pending) = pairs
    # The new connection is blocked at its 4th channel open: the first
    # producer has its channel again, the second (channel 4) not yet.
    harness.broker.block_at_channel_open[1] = 4
    harness.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert len(harness.broker.transports) == 2  # the first attempt succeeded
    assert harness.transport.channels[3].handler is pending
    assert connection.is_blocked
    assert (attached.flow_state, pending.flow_state) == ("blocked", "blocked")
    harness.transport.emit_unblocked()
    assert (attached.flow_state, pending.flow_state) == ("open", "open")
    pending.send(session.create_text_message("after"))
    assert harness.broker.published[-1].body == b"after"


def test_a_late_confirm_of_a_dead_channel_is_not_counted() -> None:
    harness = make_harness()
    connection, pairs = _producers(harness, 1)
    session, producer = pairs[0]
    producer.send(session.create_bytes_message(b"1"))
    old = harness.transport.channels[-1]
    harness.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    old.emit_ack(1)  # a late frame of the dead channel
    assert producer.unconfirmed_count == 1
    assert producer.confirmed_count == 0


def test_a_consumer_hands_out_nothing_its_lost_channel_buffered() -> None:
    harness = make_harness()
    harness.broker.queues["q"] = {}
    connection = harness.factory.create_connection()
    session = connection.create_session(acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(session.create_queue("q"))
    connection.start()
    channel = harness.transport.channels[-1]
    for tag in (1, 2, 3):
        channel.emit_deliver(tag, str(tag).encode())
    first = consumer.receive_no_wait()
    assert first is not None
    harness.transport.emit_lost()
    assert consumer.receive_no_wait() is None  # 2 and 3 came on the lost channel
    with pytest.raises(rabbitflow.StaleMessageError, match="channel that was lost"):
        first.acknowledge()


def test_a_consumer_flow_timer_lost_with_its_connection_is_armed_again() -> None:
    # Two consumers sharing a connection limit of 4: once the first holds 4
    # undelivered messages the second is parked and probed by a timer.
    harness = make_harness({"imqConnectionFlowLimitEnabled": "true", "imqConnectionFlowLimit": "4"})
    connection = harness.factory.create_connection()
    connection.start()
    session = connection.create_session()
    session.create_consumer(session.create_queue("a"))
    session.create_consumer(session.create_queue("b"))
    first = harness.transport
    for tag in range(1, 5):
        first.channels[-2].emit_deliver(tag, b"x")
    assert len(first.timers) == 1  # the probe of the parked consumer
    first.emit_lost()  # the timer goes with the connection
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    second = harness.transport
    for tag in range(1, 5):
        second.channels[1].emit_deliver(tag, b"x")
    assert len(second.timers) == 1
    connection.close()


def test_a_transaction_broken_by_a_reconnection_rolls_back_what_was_sent_after_it() -> None:
    # m1 is sent, the connection drops and recovers, m2 goes into the new
    # channel's transaction; commit() reports the rollback.  The application
    # retries the whole transaction: the broker must get m1 and m2 once each.
    h, connection, session = harness_session(start=False, transacted=True)
    producer = session.create_producer(session.create_queue("orders"))
    producer.send(session.create_text_message("m1"))
    h.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "recovery")
    producer.send(session.create_text_message("m2"))
    with pytest.raises(rabbitflow.TransactionRolledBackError):
        session.commit()
    producer.send(session.create_text_message("m1"))
    producer.send(session.create_text_message("m2"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m1", b"m2"]


def test_a_producer_created_as_the_connection_is_unblocked_does_not_stay_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # connection.unblocked reaches the I/O thread between the producer's
    # registration (which saw the connection blocked) and its gate.
    h, connection, session = harness_session(start=False)
    queue = session.create_queue("orders")
    h.transport.emit_blocked("memory alarm")
    book = connection._producers
    register = book.add

    def add_then_unblock(producer: object) -> str | None:
        reason = register(producer)  # type: ignore[arg-type]
        h.transport.emit_unblocked()
        return reason

    monkeypatch.setattr(book, "add", add_then_unblock)
    producer = session.create_producer(queue, capacity=2)
    assert not connection.is_blocked
    assert producer.flow_state == "open"


def test_a_producer_created_across_a_loss_and_its_recovery_uses_the_new_connection() -> None:
    # The connection drops, and recovery restores the session, after the
    # producer's channel opened and before the producer is registered: the
    # loss could not detach it nor the restore re-open it.
    h, connection, session = harness_session(start=False)
    queue = session.create_queue("orders")
    # 1 is the session's admin channel
    h.broker.after_channel_open[(0, 2)] = lose_and_recover(h, connection)
    producer = session.create_producer(queue, capacity=2)
    producer.send(session.create_text_message("after"))
    second = h.broker.transports[1]
    assert [p.body for p in h.broker.published] == [b"after"]
    channel = next(c for c in second.channels if c.handler is producer)
    assert h.broker.published[0].channel == channel.number
    channel.emit_ack(1)
    assert (producer.unconfirmed_count, producer.flow_state) == (0, "open")


def test_a_producer_created_as_the_connection_is_lost_opens_its_channel_on_the_new_one() -> None:
    # The loss comes after the producer's channel opened and before it is
    # registered, while recovery runs on its own thread: whichever wins, the
    # producer ends up with a channel on the new connection.
    h, connection, session = harness_session(start=False)
    queue = session.create_queue("orders")
    first = h.transport
    h.broker.after_channel_open[(0, 2)] = first.emit_lost
    producer = session.create_producer(queue, capacity=2)
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    producer.send(session.create_text_message("after"))
    assert [p.body for p in h.broker.published] == [b"after"]
    assert any(c.handler is producer for c in h.broker.transports[1].channels)
    assert producer.flow_state == "open"


def test_a_connection_blocked_as_the_new_transport_connects_blocks_the_producers() -> None:
    # The broker may send connection.blocked as soon as the handshake ends:
    # before recovery has put the new transport in use.
    h = make_harness()
    connection, pairs = _producers(h, 2)
    h.broker.block_at_connect.add(1)
    h.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert connection.is_blocked
    assert [producer.flow_state for _, producer in pairs] == ["blocked", "blocked"]
    session, producer = pairs[0]
    h.transport.emit_unblocked()
    assert not connection.is_blocked
    assert [producer.flow_state for _, producer in pairs] == ["open", "open"]
    producer.send(session.create_text_message("after"))
    assert h.broker.published[-1].body == b"after"


def test_a_connection_blocked_as_the_first_transport_connects_is_honoured() -> None:
    h = make_harness()
    h.broker.queues["orders"] = {}
    h.broker.block_at_connect.add(0)
    connection = h.factory.create_connection()
    assert connection.is_blocked
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("orders"), capacity=2)
    assert producer.flow_state == "blocked"
    h.transport.emit_unblocked()
    assert producer.flow_state == "open"


def test_a_connection_blocked_by_a_failed_attempt_does_not_block_the_next_one() -> None:
    h = make_harness()
    connection, pairs = _producers(h, 1)
    h.broker.block_at_connect.add(1)
    h.broker.lose_at_channel_open[1] = 1  # the attempt dies restoring
    h.transport.emit_lost()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    assert len(h.broker.transports) == 3
    assert not connection.is_blocked
    assert pairs[0][1].flow_state == "open"


def test_a_consumer_created_across_a_loss_and_its_recovery_uses_the_new_connection() -> None:
    # The connection drops, and recovery restores the session, after the
    # consumer's channel opened and before the consumer is registered: the
    # restore could not re-open it, so it would consume on the dead channel.
    h, connection, session = harness_session()
    queue = session.create_queue("orders")
    first = h.transport
    # 1 is the session's admin channel
    h.broker.after_channel_open[(0, 2)] = lose_and_recover(h, connection)
    consumer = session.create_consumer(queue)
    consuming = [c for c in h.broker.transports[1].channels if c.handler is consumer]
    assert len(consuming) == 1
    assert ("consume", "orders") in consuming[0].calls
    stale = first.channels[1]
    assert stale.detached  # its late deliveries reach nobody
    assert stale.closed
    consuming[0].emit_deliver(1, b"after")
    message = consumer.receive_no_wait()
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "after"


def test_a_consumer_created_as_the_connection_is_lost_opens_its_channel_on_the_new_one() -> None:
    # The loss comes after the consumer's channel opened and before it is
    # registered, while recovery runs on its own thread: whichever wins, the
    # consumer ends up consuming on the new connection.
    h, connection, session = harness_session()
    queue = session.create_queue("orders")
    first = h.transport
    h.broker.after_channel_open[(0, 2)] = first.emit_lost
    consumer = session.create_consumer(queue)
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    consuming = [c for c in h.broker.transports[1].channels if c.handler is consumer]
    assert len(consuming) == 1
    assert ("consume", "orders") in consuming[0].calls


def test_a_topic_consumer_created_across_a_loss_subscribes_on_the_new_connection() -> None:
    # A private subscription's queue is exclusive: it goes with the
    # connection it was declared on, so the consumer needs a new one.
    h, connection, session = harness_session(queue=None)
    topic = session.create_topic("prices")
    first = h.transport
    bound_before_recovery: list[int] = []

    def lose_and_recover() -> None:
        first.emit_lost()
        for queue, *_ in h.broker.bindings:  # the broker deletes the exclusive queue
            h.broker.queues.pop(queue, None)
        wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
        bound_before_recovery.append(len(h.broker.bindings))

    h.broker.after_channel_open[(0, len(first.channels) + 1)] = lose_and_recover  # the next one
    consumer = session.create_consumer(topic)
    consuming = [c for c in h.broker.transports[1].channels if c.handler is consumer]
    assert len(consuming) == 1
    queue = consumer.queue_name
    assert ("consume", queue) in consuming[0].calls
    assert queue in h.broker.queues
    assert (queue, "prices", "#") in h.broker.bindings[bound_before_recovery[0] :]


def _consumer_restarted_across_a_loss(
    transacted: bool, restart: Callable[[rabbitflow.Session], None]
) -> tuple[Harness, rabbitflow.Session, rabbitflow.MessageConsumer]:
    """A consumer whose session's ``restart`` (recover() or rollback()) opens
    the consumer's new channel, and then the connection drops and recovery
    restores the session before the restart has attached that channel."""
    h, connection, session = harness_session(
        transacted=transacted, acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE
    )
    consumer = session.create_consumer(session.create_queue("orders"))
    first = h.transport
    # the restart's channel
    h.broker.after_channel_open[(0, len(first.channels) + 1)] = lose_and_recover(h, connection)
    restart(session)
    return h, session, consumer


def _live_channel(h: Harness, consumer: rabbitflow.MessageConsumer) -> FakeChannel:
    """The consumer's one open channel, on the new connection; the restart's
    channel on the old one was left (its late deliveries reach nobody)."""
    first, second = h.broker.transports
    stale = first.channels[-1]
    assert (stale.detached, stale.closed) == (True, True)
    assert not any(call[0] == "consume" for call in stale.calls)
    live = [c for c in second.channels if c.handler is consumer and not c.closed]
    assert len(live) == 1
    assert ("consume", "orders") in live[0].calls
    return live[0]


def test_a_recover_across_a_loss_and_its_recovery_consumes_on_the_new_connection() -> None:
    # The restore gives the consumer a channel on the new connection first;
    # the recover's channel, opened on the dead one, must not replace it.
    h, _, consumer = _consumer_restarted_across_a_loss(False, lambda s: s.recover())
    live = _live_channel(h, consumer)
    live.emit_deliver(1, b"after")
    message = consumer.receive_no_wait()
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "after"
    message.acknowledge()
    assert live.calls[-1] == ("ack", 1, True)


def test_a_rollback_across_a_loss_and_its_recovery_consumes_on_the_new_connection() -> None:
    h, _, consumer = _consumer_restarted_across_a_loss(True, lambda s: s.rollback())
    live = _live_channel(h, consumer)
    assert live.transactional
    live.emit_deliver(1, b"after")
    message = consumer.receive_no_wait()
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "after"


def test_a_recover_as_the_connection_is_lost_consumes_on_the_new_connection() -> None:
    # The loss comes after the recover's channel opened, while recovery runs
    # on its own thread: whichever wins, the consumer ends up consuming on
    # the new connection, on one channel.
    h, connection, session = harness_session(acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(session.create_queue("orders"))
    first = h.transport
    h.broker.after_channel_open[(0, len(first.channels) + 1)] = first.emit_lost
    session.recover()
    wait_for(lambda: connection.reconnect_count == 1, "the reconnection")
    live = _live_channel(h, consumer)
    live.emit_deliver(1, b"after")
    message = consumer.receive_no_wait()
    assert message is not None
    message.acknowledge()
    assert live.calls[-1] == ("ack", 1, True)
