"""rabbitflow.aio over an in-memory transport: send() suspends under flow
control with the sync SDK's log lines and timeout, cancellation leaves the
message unsent, nacked messages are re-sent, recovery re-sends."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

import rabbitflow
from rabbitflow import aio
from rabbitflow.aio._producer import _PUMP_BATCH, _YIELD_EVERY

from .aio_fakes import Broker, FakeAioChannel, fake_factory

FAST = {
    "qpid.flow_control_wait_failure": 2000,
    "qpid.flow_control_wait_notify_period": 1000,
    "rabbitflow.reconnect_initial_delay": 10,
    "rabbitflow.reconnect_max_delay": 20,
}


async def _setup(
    capacity: int = 2, properties: dict[str, object] | None = None
) -> tuple[Broker, aio.Connection, aio.Session, aio.MessageProducer, FakeAioChannel]:
    broker = Broker(queues={"orders"})
    connection = await fake_factory(broker, properties or FAST).create_connection()
    session = connection.create_session()
    producer = await session.create_producer(
        await session.create_queue("orders"), capacity=capacity
    )
    channel = broker.transports[-1].channels[-1]
    return broker, connection, session, producer, channel


async def _session_to_lose(
    broker: Broker, *, start: bool = False, acknowledge_mode: int = rabbitflow.AUTO_ACKNOWLEDGE
) -> tuple[aio.Connection, aio.Session, Callable[[], Awaitable[None]]]:
    """A session on a new connection to ``broker`` (started first if
    ``start``), and a play that drops that connection and returns once
    recovery reconnected."""
    connection = await fake_factory(broker, FAST).create_connection()
    if start:
        connection.start()
    session = connection.create_session(acknowledge_mode)
    first = broker.transports[0]

    async def lose_and_recover() -> None:
        first.emit_lost()
        await _until(lambda: connection.reconnect_count == 1, "the reconnection")

    return connection, session, lose_and_recover


def _bodies(broker: Broker) -> list[bytes]:
    return [body for _, body in broker.published]


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


@pytest.mark.asyncio
async def test_sends_are_published_in_order_in_one_loop_turn() -> None:
    broker, _, session, producer, channel = await _setup(capacity=10)
    for n in range(5):
        await producer.send(session.create_bytes_message(str(n).encode()))
    assert _bodies(broker) == []  # accepted; written on the next loop turn, together
    await asyncio.sleep(0)
    assert _bodies(broker) == [b"0", b"1", b"2", b"3", b"4"]
    channel.emit_ack(5, multiple=True)
    assert producer.unconfirmed_count == 0


@pytest.mark.asyncio
async def test_a_flowed_send_suspends_warns_and_times_out_with_the_spec_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    broker, _, session, producer, channel = await _setup()
    channel.emit_flow(False)
    started = time.monotonic()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    with pytest.raises(rabbitflow.FlowControlTimeoutError) as info:
        await producer.send(session.create_text_message("held"))
    ticking.cancel()
    assert isinstance(info.value, TimeoutError)
    assert str(info.value) == (
        "Unable to send message for 2 seconds due to broker enforced flow control"
    )
    assert time.monotonic() - started >= 1.99
    assert ticks > 50  # the loop kept running other tasks meanwhile
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("INFO", "Broker enforced flow control has been enforced") in messages
    assert ("WARNING", "Message send delayed by 1s due to broker enforced flow control") in messages
    assert (
        "ERROR",
        "Message send failed due to timeout waiting on broker enforced flow control",
    ) in messages
    assert _bodies(broker) == []
    assert producer.sent_count == 0


@pytest.mark.asyncio
async def test_flow_lifting_resumes_a_suspended_send() -> None:
    broker, _, session, producer, channel = await _setup()
    channel.emit_flow(False)
    sending = asyncio.create_task(producer.send(session.create_text_message("x")))
    await asyncio.sleep(0.05)
    assert not sending.done()
    channel.emit_flow(True)
    await asyncio.wait_for(sending, 1)
    await asyncio.sleep(0)
    assert _bodies(broker) == [b"x"]


@pytest.mark.asyncio
async def test_cancelling_a_suspended_send_leaves_it_unsent_and_the_producer_usable() -> None:
    broker, _, session, producer, channel = await _setup(capacity=1)
    await producer.send(session.create_text_message("1"))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(producer.send(session.create_text_message(f"w{n}"))) for n in range(3)
    ]
    await asyncio.sleep(0.05)
    waiting[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting[1]
    channel.emit_ack(1)
    await _until(lambda: waiting[0].done() or waiting[2].done(), "a waiting send to go")
    channel.emit_ack(2)
    await asyncio.wait_for(asyncio.gather(waiting[0], waiting[2]), 2)
    await asyncio.sleep(0)
    channel.emit_ack(3)
    assert sorted(_bodies(broker)) == [b"1", b"w0", b"w2"]
    assert producer.sent_count == 3
    await producer.send(session.create_text_message("after"))
    await asyncio.sleep(0)
    assert _bodies(broker)[-1] == b"after"


@pytest.mark.asyncio
async def test_a_send_accepted_as_a_nack_arrives_goes_out_once_the_retry_ends() -> None:
    broker, _, session, producer, channel = await _setup(capacity=3)
    await producer.send(session.create_text_message("1"))
    await asyncio.sleep(0)
    await producer.send(session.create_text_message("2"))  # its publish turn is still queued
    channel.emit_nack(1)
    await _until(lambda: len(broker.published) == 2, "the re-send of 1")
    assert _bodies(broker) == [b"1", b"1"]
    channel.emit_ack(2)
    await _until(lambda: len(broker.published) == 3, "2, without another send")
    assert _bodies(broker) == [b"1", b"1", b"2"]
    channel.emit_ack(3)
    assert producer.unconfirmed_count == 0


@pytest.mark.asyncio
async def test_a_confirm_leaves_what_is_queued_to_the_publish_turn_already_scheduled() -> None:
    broker, _, session, producer, channel = await _setup(capacity=3)
    await producer.send(session.create_text_message("1"))
    await asyncio.sleep(0)
    await producer.send(session.create_text_message("2"))  # its publish turn is still queued
    channel.emit_ack(1)
    assert _bodies(broker) == [b"1"]
    await asyncio.sleep(0)
    assert _bodies(broker) == [b"1", b"2"]
    channel.emit_ack(2)
    assert producer.unconfirmed_count == 0


@pytest.mark.asyncio
async def test_a_lost_connection_resends_what_was_unconfirmed_in_order() -> None:
    broker, connection, session, producer, channel = await _setup(capacity=5)
    for n in (b"1", b"2", b"3"):
        await producer.send(session.create_bytes_message(n))
    await asyncio.sleep(0)
    channel.emit_ack(1)
    broker.refuse_connects = 1  # the first attempt fails too
    broker.transports[0].emit_lost()
    assert producer.flow_state == "disconnected"
    await _until(lambda: connection.reconnect_count == 1, "the reconnection")
    await _until(lambda: len(broker.published) == 5, "the re-sends")
    assert broker.published[3:] == [(2, b"2"), (2, b"3")]
    assert producer.resent_count == 2
    new_channel = broker.transports[-1].channels[-1]
    new_channel.emit_ack(2, multiple=True)
    await producer.send(session.create_bytes_message(b"4"))
    await asyncio.sleep(0)
    assert _bodies(broker)[-1] == b"4"


@pytest.mark.asyncio
async def test_close_reports_unconfirmed_messages_with_their_count() -> None:
    _, _, session, producer, _ = await _setup(
        properties={**FAST, "qpid.flow_control_wait_failure": 200}
    )
    await producer.send(session.create_text_message("never confirmed"))
    with pytest.raises(rabbitflow.UnconfirmedMessagesError) as info:
        await producer.close()
    assert info.value.unconfirmed == 1


@pytest.mark.asyncio
async def test_connection_blocked_holds_every_producer() -> None:
    broker, _, session, producer, _ = await _setup()
    other = await session.create_producer(rabbitflow.Queue("orders"))
    broker.transports[-1].emit_blocked()
    assert (producer.flow_state, other.flow_state) == ("blocked", "blocked")
    sending = asyncio.create_task(other.send(session.create_text_message("x")))
    await asyncio.sleep(0.05)
    assert not sending.done()
    broker.transports[-1].emit_unblocked()
    await asyncio.wait_for(sending, 1)


@pytest.mark.asyncio
async def test_a_connection_blocked_during_restore_holds_the_producers_not_yet_reattached() -> None:
    broker = Broker(queues={"q0", "q1"})
    connection = await fake_factory(broker, FAST).create_connection()
    sessions = [connection.create_session() for _ in range(2)]
    attached, pending = [
        await s.create_producer(await s.create_queue(f"q{n}")) for n, s in enumerate(sessions)
    ]
    # The new connection is blocked at its 4th channel open: the first
    # producer has its channel again, the second (channel 4) not yet.
    broker.block_at_channel_open[1] = 4
    broker.transports[0].emit_lost()
    await _until(lambda: connection.reconnect_count == 1, "the reconnection")
    assert len(broker.transports) == 2  # the first attempt succeeded
    assert broker.transports[1].channels[3].handler is pending
    assert (attached.flow_state, pending.flow_state) == ("blocked", "blocked")
    broker.transports[1].emit_unblocked()
    await pending.send(sessions[1].create_text_message("after"))
    await _until(lambda: _bodies(broker) == [b"after"], "the send after the unblock")


@pytest.mark.asyncio
async def test_send_after_the_broker_closed_the_channel_raises_its_error() -> None:
    broker, _, session, producer, channel = await _setup()
    closed = rabbitflow.ProtocolError("CHN-1012 flow control ignored")
    channel.emit_closed(closed)
    with pytest.raises(rabbitflow.ProtocolError) as info:
        await producer.send(session.create_text_message("x"))
    assert info.value is closed
    assert (producer.sent_count, _bodies(broker)) == (0, [])


@pytest.mark.asyncio
async def test_a_message_amqp_cannot_carry_is_refused_before_it_is_accepted() -> None:
    broker, _, session, producer, channel = await _setup()
    for attribute, value, error in (
        ("correlation_id", "c" * 256, "correlation_id is 256 bytes"),
        ("properties", {"n": 1 << 70}, "property 'n': 1180591620717411303424 is outside"),
    ):
        bad = session.create_text_message("bad")
        setattr(bad, attribute, value)
        with pytest.raises(rabbitflow.MessageFormatError, match=error):
            await producer.send(bad)
    assert producer.sent_count == 0
    await producer.send(session.create_text_message("good"))
    await _until(lambda: _bodies(broker) == [b"good"], "the good message")
    channel.emit_ack(1)
    assert (producer.confirmed_count, producer.unconfirmed_count) == (1, 0)


@pytest.mark.asyncio
async def test_bad_arguments_are_value_errors_naming_the_argument() -> None:
    _, _, session, producer, _ = await _setup()
    with pytest.raises(ValueError, match="priority"):
        await producer.send(session.create_text_message("x"), priority=11)
    with pytest.raises(ValueError, match="capacity"):
        await session.create_producer(rabbitflow.Queue("orders"), capacity=0)


@pytest.mark.asyncio
async def test_async_for_hands_out_deliveries_in_order_and_ends_at_close() -> None:
    broker, connection, session, _, _ = await _setup()
    consumer = await session.create_consumer(rabbitflow.Queue("orders"))
    channel = broker.transports[-1].channels[-1]
    connection.start()
    for tag in (1, 2, 3):
        channel.emit_deliver(tag, str(tag).encode())
    got: list[str] = []

    async def read() -> None:
        async for message in consumer:
            assert isinstance(message, rabbitflow.TextMessage)
            got.append(message.text)

    reading = asyncio.create_task(read())
    await _until(lambda: len(got) == 3, "three messages")
    assert await consumer.receive(0.01) is None
    await consumer.close()
    await asyncio.wait_for(reading, 1)
    assert got == ["1", "2", "3"]
    assert channel.prefetch  # the flow machine set the consumer's credit


@pytest.mark.asyncio
async def test_a_consumer_asks_for_the_next_batch_at_its_threshold() -> None:
    broker = Broker(queues={"orders"})
    factory = fake_factory(broker, {"imqConsumerFlowLimit": 10, "imqConsumerFlowThreshold": 50})
    connection = await factory.create_connection()
    session = connection.create_session()
    consumer = await session.create_consumer(rabbitflow.Queue("orders"))
    channel = broker.transports[-1].channels[-1]
    connection.start()
    assert channel.prefetch == [10]  # the first batch: the whole limit
    assert channel.consuming
    for tag in range(1, 11):
        channel.emit_deliver(tag, str(tag).encode())
    assert consumer.flow_stats().buffered == 10
    for _ in range(4):
        assert await consumer.receive(0) is not None
    assert channel.prefetch == [10]  # 6 buffered: above the threshold of 5
    assert await consumer.receive(0) is not None
    # Down to the threshold: the five processed are acked, which grants five
    # more credits (the prefetch count, buffered + credit, stays 10).
    assert channel.acks == [(5, True)]
    stats = consumer.flow_stats()
    assert (stats.buffered, stats.credit, stats.grants) == (5, 5, (10, 5))
    assert channel.prefetch == [10]


@pytest.mark.asyncio
async def test_recover_moves_consumers_to_new_channels_and_hands_out_nothing_old() -> None:
    broker = Broker(queues={"orders"})
    connection = await fake_factory(broker).create_connection()
    session = connection.create_session(rabbitflow.CLIENT_ACKNOWLEDGE)
    consumer = await session.create_consumer(rabbitflow.Queue("orders"))
    old = broker.transports[-1].channels[-1]
    connection.start()
    for tag in (1, 2, 3):
        old.emit_deliver(tag, str(tag).encode())
    first = await consumer.receive(0)
    assert first is not None
    await session.recover()
    new = broker.transports[-1].channels[-1]
    assert new is not old
    assert old.closed  # the broker redelivers its unacknowledged messages
    assert await consumer.receive(0) is None  # nothing of the old channel
    with pytest.raises(rabbitflow.StaleMessageError):
        first.acknowledge()
    new.emit_deliver(1, b"1")
    again = await consumer.receive(0)
    assert again is not None
    assert again.text == "1"  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_unsubscribe_deletes_the_durable_subscription_queue() -> None:
    broker = Broker()
    connection = await fake_factory(broker).create_connection()
    session = connection.create_session()
    subscriber = await session.create_durable_subscriber(
        await session.create_topic("prices"), "audit"
    )
    assert "audit" in broker.queues
    await subscriber.close()
    await session.unsubscribe("audit")
    assert "audit" not in broker.queues


@pytest.mark.asyncio
async def test_tasks_waiting_on_a_full_window_go_in_the_order_they_came() -> None:
    broker, _, session, producer, channel = await _setup(capacity=1)
    await producer.send(session.create_text_message("first"))
    await asyncio.sleep(0)
    waiting = []
    for n in range(6):
        waiting.append(asyncio.create_task(producer.send(session.create_text_message(f"w{n}"))))
        await asyncio.sleep(0)  # each starts waiting before the next is created
    for tag in range(1, 7):
        channel.emit_ack(tag)
        expected = tag + 1
        await _until(lambda: len(broker.published) == expected, f"publish {expected}")  # noqa: B023
    channel.emit_ack(7)
    await asyncio.gather(*waiting)
    assert _bodies(broker) == [b"first", *(f"w{n}".encode() for n in range(6))]


@pytest.mark.asyncio
async def test_a_task_whose_sends_never_wait_still_lets_the_loop_run() -> None:
    _, _, session, producer, _ = await _setup(capacity=5000)
    turns = 0
    sending = True

    async def count_turns() -> None:
        nonlocal turns
        while sending:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)  # the counter starts
    before = turns
    for n in range(1280):  # the window never fills: no send has to wait
        await producer.send(session.create_text_message(str(n)))
    sending = False
    await counter
    # Without a yield the 1,280 sends would run in one turn of the loop; the
    # driver yields once every _YIELD_EVERY (64).
    assert _YIELD_EVERY < 1280 // 8
    assert turns - before >= 1280 // _YIELD_EVERY - 1


@pytest.mark.asyncio
async def test_a_long_queue_is_published_in_bounded_batches() -> None:
    broker, connection, session, producer, channel = await _setup(capacity=2000)
    for n in range(1500):
        await producer.send(session.create_text_message(str(n)))
    await _until(lambda: len(broker.published) == 1500, "the publishes")
    broker.transports[-1].emit_lost()  # all 1,500 unconfirmed: re-sent at once
    await _until(lambda: connection.reconnect_count == 1, "the reconnection")
    resent = broker.transports[-1].channels[-1]
    await _until(lambda: sum(resent.batches) == 1500, "the re-sends")
    assert max(resent.batches) <= _PUMP_BATCH < 1500
    assert max(channel.batches) <= _PUMP_BATCH


@pytest.mark.asyncio
async def test_sends_blocked_together_log_their_warnings_a_few_per_loop_turn() -> None:
    properties = {**FAST, "qpid.flow_control_wait_notify_period": 200}
    _, _, session, producer, channel = await _setup(capacity=5, properties=properties)
    channel.emit_flow(False)
    turn = 0
    logged_in_turn: list[int] = []

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Message send delayed by"):
                logged_in_turn.append(turn)

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    handler = Record()
    logger = logging.getLogger(rabbitflow.LOGGER_NAME)
    logger.addHandler(handler)
    counter = asyncio.create_task(count_turns())
    blocked = [
        asyncio.create_task(producer.send(session.create_text_message(str(n)))) for n in range(40)
    ]
    try:
        await _until(lambda: len(logged_in_turn) >= 40, "every blocked send's warning")
    finally:
        counter.cancel()
        for task in blocked:
            task.cancel()
        await asyncio.gather(counter, *blocked, return_exceptions=True)
        logger.removeHandler(handler)
    per_turn = [logged_in_turn.count(t) for t in set(logged_in_turn[:40])]
    assert max(per_turn) <= 8


@pytest.mark.asyncio
async def test_a_producer_created_across_a_loss_and_its_recovery_uses_the_new_connection() -> None:
    # The connection drops, and recovery restores the session, after the
    # producer's channel opened and before the producer is registered.
    broker = Broker(queues={"orders"})
    _, session, lose_and_recover = await _session_to_lose(broker)
    queue = await session.create_queue("orders")
    broker.after_channel_open[(0, 2)] = lose_and_recover  # 1 is the session's admin channel
    producer = await session.create_producer(queue)
    await producer.send(session.create_text_message("after"))
    await _until(lambda: bool(broker.published), "the send")
    assert broker.published == [(1, b"after")]
    channel = next(c for c in broker.transports[1].channels if c.handler is producer)
    channel.emit_ack(1)
    assert (producer.unconfirmed_count, producer.flow_state) == (0, "open")


@pytest.mark.asyncio
async def test_a_connection_blocked_as_the_new_transport_connects_holds_the_producers() -> None:
    broker, connection, session, producer, _ = await _setup()
    broker.block_at_connect.add(1)
    broker.transports[0].emit_lost()
    await _until(lambda: connection.reconnect_count == 1, "the reconnection")
    assert connection.is_blocked
    assert producer.flow_state == "blocked"
    broker.transports[1].emit_unblocked()
    assert producer.flow_state == "open"
    await producer.send(session.create_text_message("after"))
    await _until(lambda: _bodies(broker) == [b"after"], "the send after the unblock")


@pytest.mark.asyncio
async def test_a_connection_blocked_as_the_first_transport_connects_is_honoured() -> None:
    broker = Broker(queues={"orders"}, block_at_connect={0})
    connection = await fake_factory(broker, FAST).create_connection()
    assert connection.is_blocked
    session = connection.create_session()
    producer = await session.create_producer(await session.create_queue("orders"))
    assert producer.flow_state == "blocked"


@pytest.mark.asyncio
async def test_a_consumer_created_across_a_loss_and_its_recovery_uses_the_new_connection() -> None:
    # The connection drops, and recovery restores the session, after the
    # consumer's channel opened and before the consumer is registered.
    broker = Broker(queues={"orders"})
    _, session, lose_and_recover = await _session_to_lose(broker, start=True)
    queue = await session.create_queue("orders")
    broker.after_channel_open[(0, 2)] = lose_and_recover  # 1 is the session's admin channel
    consumer = await session.create_consumer(queue)
    consuming = [c for c in broker.transports[1].channels if c.handler is consumer]
    assert len(consuming) == 1
    assert consuming[0].consumed == ["orders"]
    stale = broker.transports[0].channels[1]
    assert stale.handler is not consumer  # its late deliveries reach nobody
    assert stale.closed
    consuming[0].emit_deliver(1, b"after")
    message = await consumer.receive(0)
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "after"


@pytest.mark.asyncio
async def test_a_topic_consumer_created_across_a_loss_subscribes_on_the_new_connection() -> None:
    # A private subscription's queue is exclusive: it goes with the
    # connection it was declared on, so the consumer needs a new one.
    broker = Broker()
    connection, session, _ = await _session_to_lose(broker, start=True)
    topic = await session.create_topic("prices")
    first = broker.transports[0]
    bound_before_recovery: list[int] = []

    async def lose_and_recover() -> None:
        first.emit_lost()
        for queue, _ in broker.bindings:  # the broker deletes the exclusive queue
            broker.queues.discard(queue)
        await _until(lambda: connection.reconnect_count == 1, "the reconnection")
        bound_before_recovery.append(len(broker.bindings))

    broker.after_channel_open[(0, len(first.channels) + 1)] = lose_and_recover  # the next one
    consumer = await session.create_consumer(topic)
    consuming = [c for c in broker.transports[1].channels if c.handler is consumer]
    assert len(consuming) == 1
    queue = consumer.queue_name
    assert consuming[0].consumed == [queue]
    assert queue in broker.queues
    assert (queue, "prices") in broker.bindings[bound_before_recovery[0] :]


@pytest.mark.asyncio
async def test_a_recover_across_a_loss_and_its_recovery_consumes_on_the_new_connection() -> None:
    # The restore gives the consumer a channel on the new connection first;
    # the recover's channel, opened on the dead one, must not replace it.
    broker = Broker(queues={"orders"})
    _, session, lose_and_recover = await _session_to_lose(
        broker, start=True, acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE
    )
    consumer = await session.create_consumer(rabbitflow.Queue("orders"))
    first = broker.transports[0]
    broker.after_channel_open[(0, len(first.channels) + 1)] = lose_and_recover  # the recover's
    await session.recover()
    stale = first.channels[-1]
    assert stale.handler is not consumer  # its late deliveries reach nobody
    assert stale.closed
    assert stale.consumed == []
    live = [c for c in broker.transports[1].channels if c.handler is consumer and not c.closed]
    assert len(live) == 1
    assert live[0].consumed == ["orders"]
    live[0].emit_deliver(1, b"after")
    message = await consumer.receive(0)
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "after"
    message.acknowledge()
    assert live[0].acks == [(1, True)]
