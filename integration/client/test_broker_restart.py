"""The producer recovers from a broker restart mid-stream (issue 2, item 3).

A throwaway node is stopped and started again while a producer (capacity
100) is sending 10,000 persistent messages on a background thread.  The
producer must reconnect, re-declare and re-send what was not confirmed, so
the queue ends with every message; a message may appear twice only when
its confirm was lost with the connection, and the SDK must count those.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

import rabbitflow

from ..conftest import Broker
from ._support import Sender, drain, numbers, wait_until

TOTAL = 10_000
RESTART_AFTER = 2_000


def _pace_after_restart_point(n: int) -> None:
    # Past the restart point the stream is slowed (about 2 ms a message) so
    # that the broker goes down while sends are still being made, not after.
    if n > RESTART_AFTER:
        time.sleep(0.002)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_producer_recovers_from_a_broker_restart_with_every_message_kept(
    throwaway_broker: Broker, unique_name: Callable[[str], str]
) -> None:
    node = throwaway_broker.node
    assert node is not None
    queue = unique_name("restart")
    factory = rabbitflow.ConnectionFactory(throwaway_broker.url)
    with factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=100)
        sender = Sender(producer, session, range(1, TOTAL + 1), _pace_after_restart_point)
        sender.start()
        wait_until(
            lambda: sender.returned >= RESTART_AFTER or not sender.is_alive(),
            120,
            f"{RESTART_AFTER} sends",
        )
        assert sender.is_alive(), f"sender ended early: {sender.error!r}"
        node.stop()
        sent_before_the_node_was_down = sender.returned
        node.start()
        sender.join(timeout=300)
        assert not sender.is_alive(), "the producer did not finish after the restart"
        assert sender.error is None, repr(sender.error)
        assert sender.returned == TOTAL
        producer.close()  # waits for the outstanding confirms
        lost_confirms = producer.resent_count
    assert sent_before_the_node_was_down < TOTAL, "the restart came after the stream ended"

    ids = numbers(drain(throwaway_broker.url, queue))
    missing = sorted(set(range(1, TOTAL + 1)) - set(ids))
    assert not missing, f"{len(missing)} messages lost, first {missing[:10]}"
    duplicates = {n: c for n, c in Counter(ids).items() if c > 1}
    assert sum(c - 1 for c in duplicates.values()) <= lost_confirms, (
        f"{len(duplicates)} duplicated ids, {lost_confirms} reported re-sent unconfirmed"
    )
    first_seen = list(dict.fromkeys(ids))
    assert first_seen == list(range(1, TOTAL + 1)), "messages were reordered"
