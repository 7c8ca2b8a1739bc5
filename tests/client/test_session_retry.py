"""A session operation that a connection loss interrupts runs again on the
new connection, also when the recovery is over by the time its error is
seen (sync and aio)."""

from __future__ import annotations

import pytest

import rabbitflow

from .aio_fakes import Broker, fake_factory
from .fakes import harness_session, lose_and_recover
from .test_aio_producer import FAST, _until
from .test_tx_recovery import _channel_of


def test_a_producer_channel_setup_a_loss_interrupts_runs_again_once_the_recovery_is_done() -> None:
    # The loss comes while the new producer's confirm.select is on its way,
    # and the recovery is done before that select fails: the producer gets
    # its channel on the new connection.
    h, connection, session = harness_session(start=False)
    queue = session.create_queue("orders")
    h.broker.at_select[(0, len(h.transport.channels) + 1)] = lose_and_recover(h, connection)
    producer = session.create_producer(queue)
    assert connection.reconnect_count == 1
    live = _channel_of(h, 1, producer)
    producer.send(session.create_text_message("after"))
    assert [m.channel for m in h.broker.published] == [live.number]
    live.emit_ack(1)
    assert producer.unconfirmed_count == 0


def test_an_operation_that_fails_on_the_connection_it_started_on_is_not_retried() -> None:
    # The select fails with no loss (its channel closed): the error is the caller's.
    h, connection, session = harness_session(start=False)
    queue = session.create_queue("orders")

    def close_the_channel() -> None:
        h.transport.channels[-1].closed = True

    h.broker.at_select[(0, len(h.transport.channels) + 1)] = close_the_channel
    with pytest.raises(rabbitflow.ConnectionLostError):
        session.create_producer(queue)
    assert len(h.transport.channels) == 2  # the admin channel and the producer's, once
    assert connection.reconnect_count == 0


async def _aio_session(broker: Broker) -> tuple[rabbitflow.aio.Connection, rabbitflow.aio.Session]:
    connection = await fake_factory(broker, FAST).create_connection()
    return connection, connection.create_session()


@pytest.mark.asyncio
@pytest.mark.parametrize("durable", [False, True])
async def test_an_aio_declare_a_loss_interrupts_runs_again_once_the_recovery_is_done(
    durable: bool,
) -> None:
    # create_queue (its passive declare) or create_durable_subscriber (its
    # queue's declare): the loss comes while the declare is on its way, and
    # the recovery is done before the declare fails.
    broker = Broker(queues={"orders"})
    connection, session = await _aio_session(broker)
    topic = await session.create_topic("prices")

    async def lose_and_recover() -> None:
        broker.transports[0].emit_lost()
        await _until(lambda: connection.reconnect_count == 1, "the reconnection")

    name = "audit" if durable else "orders"
    broker.at_queue_declare[name] = lose_and_recover
    if durable:
        await session.create_durable_subscriber(topic, name)
        assert ("audit", "prices") in broker.bindings
    else:
        assert await session.create_queue(name) == rabbitflow.Queue(name)
    assert connection.reconnect_count == 1
    assert name in broker.queues
    await connection.close()
