"""A transacted session's rollback() across a connection loss and its recovery."""

from collections.abc import Callable

import pytest

import rabbitflow
from rabbitflow._producer_core import ProducerCounters
from rabbitflow._session_tx import Transaction

from .fakes import FakeChannel, Harness, lose_and_recover, make_harness


def _transacted(
    h: Harness, producers: int = 1
) -> tuple[rabbitflow.Connection, rabbitflow.Session, list[rabbitflow.MessageProducer]]:
    h.broker.queues["orders"] = {}
    connection = h.factory.create_connection()
    connection.start()
    session = connection.create_session(transacted=True)
    queue = session.create_queue("orders")
    return connection, session, [session.create_producer(queue) for _ in range(producers)]


def _channel_of(h: Harness, transport: int, handler: object) -> FakeChannel:
    """The open channel ``handler`` (a producer or consumer) has on that transport."""
    live = [
        c for c in h.broker.transports[transport].channels if c.handler is handler and not c.closed
    ]
    assert len(live) == 1
    return live[0]


def test_a_rollback_across_a_loss_rolls_back_the_channels_the_recovery_gave() -> None:
    # The loss comes while the second producer's tx.rollback is on its way:
    # its channel is dead and the recovery gave both producers new ones.
    # rollback() does not fail (nothing of the transaction survived the loss
    # anyway): it rolls back each producer's current channel.
    h = make_harness()
    connection, session, producers = _transacted(h, producers=2)
    for producer in producers:
        producer.send(session.create_text_message("discarded"))
    dead = _channel_of(h, 0, producers[1])
    h.broker.at_tx_rollback[(0, dead.number)] = lose_and_recover(h, connection)
    session.rollback()
    assert ("tx_rollback",) not in dead.calls  # it never reached the broker
    for producer in producers:
        assert _channel_of(h, 1, producer).calls == [("tx_rollback",)]
    producers[0].send(session.create_text_message("after"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"after"]


def test_a_rollback_across_a_loss_leaves_a_clean_transaction_behind() -> None:
    # The loss comes while rollback() restarts the consumer (its producer is
    # already rolled back).  The recovery marks the transaction broken; the
    # rollback the user asked for ends after it, so the next transaction is
    # clean and its commit() succeeds.
    h = make_harness()
    connection, session, [producer] = _transacted(h)
    consumer = session.create_consumer(rabbitflow.Queue("orders"))
    first = h.transport
    h.broker.after_channel_open[(0, len(first.channels) + 1)] = lose_and_recover(h, connection)
    session.rollback()
    assert connection.reconnect_count == 1
    producer.send(session.create_text_message("after"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"after"]
    live = _channel_of(h, 1, consumer)
    assert ("consume", "orders") in live.calls


Arm = Callable[[Harness, rabbitflow.MessageProducer, Callable[[], None]], None]


def _at_the_producer_rollback(
    h: Harness, producer: rabbitflow.MessageProducer, play: Callable[[], None]
) -> None:
    h.broker.at_tx_rollback[(0, _channel_of(h, 0, producer).number)] = play


def _at_the_consumer_restart(
    h: Harness, _producer: rabbitflow.MessageProducer, play: Callable[[], None]
) -> None:
    h.broker.after_channel_open[(0, len(h.transport.channels) + 1)] = play


@pytest.mark.parametrize("arm", [_at_the_producer_rollback, _at_the_consumer_restart])
def test_a_message_sent_during_a_rollback_and_lost_with_the_connection_fails_the_next_commit(
    arm: Arm,
) -> None:
    # A message sent after rollback() started and before the loss went with
    # the dead channel: the transaction it belongs to must not commit without
    # it (at the consumer's restart, the producer was already rolled back, so
    # m1 was in the next transaction).  The next commit() rolls back and says
    # so; the application's retry sends each message once.
    h = make_harness()
    connection, session, [producer] = _transacted(h)
    session.create_consumer(rabbitflow.Queue("orders"))
    lose = lose_and_recover(h, connection)

    def send_then_lose() -> None:
        producer.send(session.create_text_message("m1"))
        lose()

    arm(h, producer, send_then_lose)
    session.rollback()
    assert connection.reconnect_count == 1
    producer.send(session.create_text_message("m2"))
    with pytest.raises(rabbitflow.TransactionRolledBackError):
        session.commit()
    assert h.broker.committed == []
    producer.send(session.create_text_message("m1"))
    producer.send(session.create_text_message("m2"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m1", b"m2"]


def test_an_interrupted_rollback_leaves_a_whole_transaction_unless_a_message_was_sent() -> None:
    producer, other = ProducerCounters(), ProducerCounters()
    tx = Transaction()
    tx.lost()
    assert tx.broken
    tx.rollback_started()
    assert not tx.broken  # it discards what the loss broke
    tx.lost()  # a loss while it runs
    tx.rolled_back({producer: 3}, {producer: 3})
    assert not tx.broken
    tx.rollback_started()
    tx.lost()
    tx.rolled_back({producer: 3}, {producer: 4})  # a send meanwhile
    assert tx.broken
    tx.rollback_started()
    tx.lost()
    tx.rolled_back({producer: 3}, {producer: 3, other: 1})  # by a producer created meanwhile
    assert tx.broken
    tx.rollback_started()
    tx.rolled_back({producer: 3}, {producer: 4})  # no loss: the send is in the next one
    assert not tx.broken
