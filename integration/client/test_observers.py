"""The observers the client tests rely on, checked against raw pika."""

from __future__ import annotations

from collections.abc import Callable

import pika

from ..conftest import Broker
from ._support import AmqpTap, declare_queue, delivery_batches, drain, numbers, publish_bodies


def test_tap_splits_deliveries_into_the_batches_acks_ask_for(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("tap")
    declare_queue(broker.url, queue)
    publish_bodies(broker.url, queue, (str(n).encode() for n in range(1, 21)))

    with AmqpTap(broker.url) as tap:
        connection = pika.BlockingConnection(pika.URLParameters(tap.url))
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=4)
            received: list[bytes] = []
            unacked: list[int] = []
            for method, _properties, body in channel.consume(queue, inactivity_timeout=5):
                if method is None:
                    break
                received.append(body)
                unacked.append(method.delivery_tag)
                # Ack the oldest two only once the window is full again, so each
                # ack is answered by its own refill before the next ack leaves.
                if len(unacked) == 4:
                    channel.basic_ack(unacked[1], multiple=True)
                    del unacked[:2]
                if len(received) == 20:
                    break
            channel.basic_ack(0, multiple=True)
            channel.cancel()
        finally:
            connection.close()
        batches = delivery_batches(tap.events())

    assert numbers(received) == list(range(1, 21))
    assert sum(batches) == 20
    assert batches[0] == 4
    assert set(batches[1:]) == {2}
    assert drain(broker.url, queue) == []
