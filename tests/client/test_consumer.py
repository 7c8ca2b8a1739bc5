"""The JMS consumer and session over the fake transport."""

import pytest

import rabbitflow

from .fakes import FakeChannel, Harness, make_harness


def setup(
    properties: dict[str, object] | None = None,
    mode: int = rabbitflow.AUTO_ACKNOWLEDGE,
    transacted: bool = False,
) -> tuple[
    Harness, rabbitflow.Connection, rabbitflow.Session, rabbitflow.MessageConsumer, FakeChannel
]:
    harness = make_harness(properties or {"imqConsumerFlowLimit": 4})
    harness.broker.queues["orders"] = {}
    connection = harness.factory.create_connection()
    session = connection.create_session(transacted, mode)
    consumer = session.create_consumer(session.create_queue("orders"))
    return harness, connection, session, consumer, harness.transport.channels[-1]


def test_nothing_is_consumed_before_start() -> None:
    _, _, _, _, channel = setup()
    assert channel.calls == []


def test_start_sets_the_prefetch_and_consumes() -> None:
    _, connection, _, _, channel = setup()
    connection.start()
    assert channel.calls == [("qos", 4), ("consume", "orders")]


def test_receive_returns_the_buffered_message() -> None:
    _, connection, _, consumer, channel = setup()
    connection.start()
    channel.emit_deliver(1, b"hello")
    message = consumer.receive(0)
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "hello"


def test_receive_no_wait_returns_none_when_empty() -> None:
    _, connection, _, consumer, _ = setup()
    connection.start()
    assert consumer.receive_no_wait() is None


def test_stopped_connection_holds_buffered_messages() -> None:
    _, connection, _, consumer, channel = setup()
    connection.start()
    channel.emit_deliver(1, b"x")
    connection.stop()
    assert consumer.receive_no_wait() is None
    connection.start()
    assert consumer.receive_no_wait() is not None


def test_auto_acknowledge_acks_in_batches_at_the_threshold() -> None:
    _, connection, _, consumer, channel = setup()
    connection.start()
    for tag in range(1, 5):
        channel.emit_deliver(tag, b"x")
    consumer.receive(0)
    assert ("ack", 1, True) not in channel.calls
    consumer.receive(0)  # buffered is down to 2 = 50 % of 4
    assert channel.calls[-1] == ("ack", 2, True)


def test_flow_stats_count_buffered_messages() -> None:
    _, connection, _, consumer, channel = setup()
    connection.start()
    channel.emit_deliver(1, b"x")
    channel.emit_deliver(2, b"y")
    consumer.receive(0)
    stats = consumer.flow_stats()
    assert (stats.delivered, stats.processed, stats.buffered) == (2, 1, 1)
    assert consumer.buffered_count == 1


def test_client_acknowledge_acks_only_when_the_application_says() -> None:
    _, connection, _, consumer, channel = setup(mode=rabbitflow.CLIENT_ACKNOWLEDGE)
    connection.start()
    channel.emit_deliver(1, b"x")
    message = consumer.receive(0)
    assert message is not None
    assert not any(call[0] == "ack" for call in channel.calls)
    message.acknowledge()
    assert channel.calls[-1] == ("ack", 1, True)


def test_receive_on_a_closed_consumer_is_refused() -> None:
    _, _, _, consumer, _ = setup()
    consumer.close()
    with pytest.raises(rabbitflow.IllegalStateError, match="closed"):
        consumer.receive(0)


def test_closing_a_consumer_closes_its_channel() -> None:
    _, _, _, consumer, channel = setup()
    consumer.close()
    assert channel.closed


def test_consumer_of_a_missing_queue_is_refused() -> None:
    harness = make_harness()
    session = harness.factory.create_connection().create_session()
    with pytest.raises(rabbitflow.InvalidDestinationError, match="missing"):
        session.create_consumer(rabbitflow.Queue("missing"))


def test_create_queue_declares_only_a_missing_queue() -> None:
    harness = make_harness()
    harness.broker.queues["existing"] = {"arguments": {"x-max-length": 100}}
    session = harness.factory.create_connection().create_session()
    session.create_queue("existing")
    session.create_queue("fresh")
    assert harness.broker.queues["existing"] == {"arguments": {"x-max-length": 100}}
    assert harness.broker.queues["fresh"]["durable"] is True


def test_durable_subscriber_binds_a_durable_queue_to_the_topic() -> None:
    harness = make_harness()
    session = harness.factory.create_connection().create_session()
    topic = session.create_topic("prices")
    consumer = session.create_durable_subscriber(topic, "audit")
    assert consumer.queue_name == "audit"
    assert harness.broker.queues["audit"]["durable"] is True
    assert ("audit", "prices", "#") in harness.broker.bindings


def test_topic_consumer_gets_a_private_queue() -> None:
    harness = make_harness()
    session = harness.factory.create_connection().create_session()
    consumer = session.create_consumer(session.create_topic("prices"))
    assert harness.broker.queues[consumer.queue_name]["exclusive"] is True


def test_commit_outside_a_transaction_is_refused() -> None:
    _, _, session, _, _ = setup()
    with pytest.raises(rabbitflow.IllegalStateError, match="non-transacted"):
        session.commit()


def test_commit_acks_consumed_messages_then_commits() -> None:
    _, connection, session, consumer, channel = setup(transacted=True)
    assert channel.transactional
    connection.start()
    channel.emit_deliver(1, b"x")
    consumer.receive(0)
    session.commit()
    assert channel.calls[-2:] == [("ack", 1, True), ("tx_commit",)]


def test_bad_acknowledge_mode_is_refused() -> None:
    harness = make_harness()
    connection = harness.factory.create_connection()
    with pytest.raises(rabbitflow.InvalidPropertyError, match="acknowledge_mode"):
        connection.create_session(acknowledge_mode=42)


def test_closed_connection_refuses_new_sessions() -> None:
    harness = make_harness()
    connection = harness.factory.create_connection()
    connection.close()
    with pytest.raises(rabbitflow.IllegalStateError, match="closed"):
        connection.create_session()


def test_message_processed_after_its_consumer_closed_is_ignored() -> None:
    _, connection, _, consumer, channel = setup()
    connection.start()
    channel.emit_deliver(1, b"x")
    generation, delivery = consumer._buffer[0]
    consumer.close()
    # e.g. a listener returning late
    consumer._context.processed(consumer._control, generation, delivery)
    assert consumer.flow_stats().delivered == 0


def test_quiet_queue_messages_are_acked_once_all_are_received_and_no_more_came() -> None:
    harness, connection, _, consumer, channel = setup({"imqConsumerFlowLimit": 1000})
    connection.start()
    channel.emit_deliver(1, b"x")
    channel.emit_deliver(2, b"y")
    consumer.receive(0)
    consumer.receive(0)
    # More may be on their way: the consumer waits a quarter of a second.
    assert not any(call[0] == "ack" for call in channel.calls)
    assert harness.transport.timers
    harness.clock.advance(0.25)
    harness.transport.fire_timers()
    assert channel.calls[-1] == ("ack", 2, True)
