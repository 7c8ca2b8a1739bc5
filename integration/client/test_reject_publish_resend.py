"""Nacked messages are re-sent once a reject-publish queue drains, whether or
not the application sends again (the sync SDK, many senders).

20 threads, each with its own producer (capacity 5, wait-failure 3 s),
send numbered messages to a full ``x-overflow: reject-publish`` queue until
``send()`` raises.  Every message whose ``send()`` returned was accepted; the
broker nacked them.  Then a consumer drains the queue and nobody sends
again: every accepted message must arrive exactly once, in order per
sender, and every producer's ``close()`` must find all of them confirmed.
A message accepted while its producer's earlier one was being nacked used
to stay queued for good (one in 41, one run in three).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import pytest

import rabbitflow

from ..conftest import Broker
from ._support import QueueCollector, declare_queue, publish_bodies, wait_until

SENDERS = 20
CAPACITY = 5
LENGTH = 10


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_every_accepted_nacked_message_is_resent_after_the_queue_drains(
    broker: Broker, new_queue: Callable[[str], str], attempt: int
) -> None:
    name = new_queue(f"rp-resend{attempt}")
    declare_queue(broker.url, name, {"x-max-length": LENGTH, "x-overflow": "reject-publish"})
    publish_bodies(broker.url, name, [b"filler"] * LENGTH)
    factory = rabbitflow.ConnectionFactory(
        broker.url,
        properties={
            "qpid.flow_control_wait_failure": 3000,
            "qpid.flow_control_wait_notify_period": 1000,
        },
    )
    with factory.create_connection() as connection:
        session = connection.create_session()
        queue = session.create_queue(name)
        producers = [session.create_producer(queue, capacity=CAPACITY) for _ in range(SENDERS)]
        accepted: dict[int, int] = {}
        errors: dict[int, BaseException] = {}

        def send(index: int, producer: rabbitflow.MessageProducer) -> None:
            sent = 0
            try:
                while True:
                    producer.send(session.create_text_message(f"{index}:{sent}"))
                    sent += 1
            except rabbitflow.JMSException as exc:
                errors[index] = exc
            accepted[index] = sent

        threads = [threading.Thread(target=send, args=(i, p)) for i, p in enumerate(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all(isinstance(e, rabbitflow.FlowControlTimeoutError) for e in errors.values())
        assert len(errors) == SENDERS
        total = sum(accepted.values())
        collector = QueueCollector(broker.url, name).start()
        try:
            wait_until(
                lambda: collector.count >= LENGTH + total,
                60,
                "every accepted message",
                state=lambda: [p.unconfirmed_count for p in producers],
            )
            for producer in producers:
                producer.close()  # raises if any stayed unconfirmed
        finally:
            bodies = collector.stop()
    got: dict[int, list[int]] = defaultdict(list)
    for body in bodies:
        if body != b"filler":
            index, n = body.decode().split(":")
            got[int(index)].append(int(n))
    assert dict(got) == {i: list(range(n)) for i, n in accepted.items() if n}
