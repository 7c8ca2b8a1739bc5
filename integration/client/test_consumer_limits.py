"""Open MQ consumer flow limits, observed on the wire (issue 2, item 4).

The SDK connects through an :class:`AmqpTap`, which counts every delivery
the broker sends before the SDK can see it.  Listeners count the messages
they have finished.  "Delivered but unprocessed" is the difference, less
the deliveries the SDK handed back unseen (a consumer cancelled to give its
credit to another rejects what was already on its way), sampled at every
delivery, so the figure does not depend on the SDK's own account.
A refill is what a client ack asks for: with the prefetch constant, an ack
of n deliveries lets the broker send n more (counted from the acks'
delivery tags, not from the runs of deliveries between client frames,
which split when a late answer interleaves with the next request).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import rabbitflow

from ..conftest import Broker
from ._support import (
    BASIC,
    AmqpTap,
    WireEvent,
    ack_sizes,
    declare_queue,
    delivery_batches,
    publish_bodies,
    wait_until,
)

WORK_S = 0.005  # a slow listener: 5 ms of "work" per message


@dataclass
class Ledger:
    """Deliveries seen on the wire against messages the listeners finished."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    delivered: int = 0
    processed: int = 0
    rejected: int = 0
    peak: int = 0
    per_consumer: dict[str, int] = field(default_factory=dict)

    def on_wire(self, event: WireEvent) -> None:
        if event.is_delivery:
            with self.lock:
                self.delivered += 1
                self.peak = max(self.peak, self.delivered - self.rejected - self.processed)
        elif event.is_reject:
            with self.lock:
                self.rejected += 1

    def listener(self, name: str) -> Callable[[Any], None]:
        def on_message(_message: Any) -> None:
            time.sleep(WORK_S)
            with self.lock:
                self.processed += 1
                self.per_consumer[name] = self.per_consumer.get(name, 0) + 1

        return on_message

    def summary(self) -> str:
        with self.lock:
            return (
                f"delivered {self.delivered}, rejected {self.rejected}, "
                f"processed {self.processed}, peak {self.peak}, "
                f"per consumer {self.per_consumer}"
            )

    def done(self, total: int) -> bool:
        with self.lock:
            return self.processed >= total


def _preload(url: str, queue: str, count: int) -> None:
    declare_queue(url, queue)
    publish_bodies(url, queue, (str(n).encode() for n in range(1, count + 1)))


def _consume(
    url: str,
    queues: list[str],
    properties: dict[str, Any],
    total: int,
    *,
    broker_delay_s: float = 0.0,
) -> tuple[Ledger, list[WireEvent]]:
    ledger = Ledger()
    with AmqpTap(url, on_event=ledger.on_wire, broker_delay_s=broker_delay_s) as tap:
        factory = rabbitflow.ConnectionFactory(tap.url, properties=properties)
        with factory.create_connection() as connection:
            for queue in queues:
                session = connection.create_session()
                consumer = session.create_consumer(session.create_queue(queue))
                consumer.set_message_listener(ledger.listener(queue))
            connection.start()
            wait_until(
                lambda: ledger.done(total),
                60,
                f"{total} messages processed",
                state=ledger.summary,
            )
        return ledger, tap.events()


def test_slow_listener_never_has_more_than_the_consumer_limit_unprocessed(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("climit")
    _preload(broker.url, queue, 200)

    ledger, _events = _consume(
        broker.url,
        [queue],
        {"imqConsumerFlowLimit": 10, "imqConsumerFlowThreshold": 50},
        200,
    )

    assert ledger.delivered == 200
    assert ledger.peak <= 10, f"{ledger.peak} delivered but unprocessed"


# With a delay, the broker's deliveries reach the client one at a time, 10 ms
# apart: the listener (5 ms a message) empties its buffer before each next one
# arrives (the client once topped such a batch up by the one it had processed).
@pytest.mark.parametrize("broker_delay_s", [0.0, 0.01], ids=["prompt-broker", "late-broker"])
def test_slow_listener_is_refilled_in_batches_of_half_to_all_of_the_limit(
    broker: Broker, new_queue: Callable[[str], str], broker_delay_s: float
) -> None:
    queue = new_queue("cbatch")
    _preload(broker.url, queue, 200)

    ledger, events = _consume(
        broker.url,
        [queue],
        {"imqConsumerFlowLimit": 10, "imqConsumerFlowThreshold": 50},
        200,
        broker_delay_s=broker_delay_s,
    )

    # The prefetch is set once (the limit): after that each ack is a refill
    # request, for as many deliveries as it acknowledges.
    channel = next(e.channel for e in events if e.is_delivery)
    qos = (BASIC, 10)
    prefetches = [
        e
        for e in events
        if e.upstream and e.channel == channel and (e.class_id, e.method_id) == qos
    ]
    assert len(prefetches) == 1, prefetches
    refills = ack_sizes(events)
    assert sum(refills) == 200
    assert max(refills) <= 10, refills
    # The last ack may be short: the queue ran out.
    assert all(5 <= size <= 10 for size in refills[:-1]), refills
    # The broker's answers never outrun them: no run of deliveries between
    # two client frames is longer than the limit.
    assert max(delivery_batches(events)) <= 10
    assert ledger.peak <= 10, f"{ledger.peak} delivered but unprocessed"


def test_connection_limit_caps_what_all_consumers_have_buffered(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queues = [new_queue(f"conn{i}") for i in range(3)]
    for queue in queues:
        _preload(broker.url, queue, 60)

    ledger, _events = _consume(
        broker.url,
        queues,
        {"imqConnectionFlowLimitEnabled": "true", "imqConnectionFlowLimit": 12},
        180,
    )

    assert ledger.per_consumer == dict.fromkeys(queues, 60)
    assert ledger.peak <= 12, f"{ledger.peak} delivered but unprocessed on the connection"


def test_connection_limit_is_one_total_a_busy_consumer_may_fill(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    busy, idle = new_queue("cbusy"), new_queue("cidle")
    _preload(broker.url, busy, 600)
    declare_queue(broker.url, idle)

    ledger = Ledger()
    properties = {
        "imqConnectionFlowLimitEnabled": "true",
        "imqConnectionFlowLimit": 60,
        "imqConsumerFlowThreshold": 50,
    }
    with AmqpTap(broker.url, on_event=ledger.on_wire) as tap:
        factory = rabbitflow.ConnectionFactory(tap.url, properties=properties)
        with factory.create_connection() as connection:
            consumers = {}
            # The idle queue's consumer first: it must not keep credit it cannot use.
            for queue in (idle, busy):
                session = connection.create_session()
                consumers[queue] = session.create_consumer(session.create_queue(queue))
                consumers[queue].set_message_listener(ledger.listener(queue))
            connection.start()
            wait_until(lambda: ledger.done(600), 60, "600 messages processed", state=ledger.summary)
            stats = consumers[busy].flow_stats()

    assert ledger.per_consumer == {busy: 600}
    assert ledger.peak <= 60, f"{ledger.peak} delivered but unprocessed on the connection"
    # The whole limit went to the busy consumer (an even split would cap it
    # at 30), and it used more than a split's share of it.
    assert stats.grants[0] == 60, stats.grants
    assert stats.max_buffered > 30, stats.max_buffered
    # Each batch comes once the buffer is down to 50 % of 60 and fills it to 60.
    assert all(30 <= g <= 60 for g in stats.grants), stats.grants
