"""The Qpid example: two producers against stop 100 / resume 50.

The queue's depth is sampled from RabbitMQ itself while they run.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

from integration.broker._depth import DepthWatcher
from integration.broker._producers import WindowProducer, wait_done
from integration.broker.conftest import RunningGateway, wait_for
from integration.conftest import Broker

STOP, RESUME = 100, 50
CAPACITIES = {"a": 50, "b": 15}
# Once both producers are blocked each may send this many more.  The
# drained queue restarts below RESUME, so RESUME + 2 * AFTER_BLOCK <= STOP
# keeps it from stopping a second time however slow the consumer is.
AFTER_BLOCK = 25


def _drain(gateway: RunningGateway, queue: str, expected: int) -> list[bytes]:
    connection = gateway.connect()
    channel = connection.channel()
    bodies: list[bytes] = []
    # No-ack: depth drops as fast as RabbitMQ delivers, so the resumed
    # producers cannot refill the queue past the stop threshold.
    for method, _props, body in channel.consume(queue, auto_ack=True, inactivity_timeout=30):
        assert method is not None, f"only {len(bodies)} of {expected} messages arrived"
        bodies.append(body)
        if len(bodies) == expected:
            break
    channel.cancel()
    connection.close()
    return bodies


class SdkProducer(threading.Thread):
    """A rabbitflow SDK producer (its own connection) sending ``<pid>:<seq>`` texts."""

    def __init__(self, url: str, queue: str, *, pid: str, count: int | None, capacity: int) -> None:
        super().__init__(name=f"sdk-producer-{pid}", daemon=True)
        self.url, self.queue, self.pid = url, queue, pid
        self.count, self.capacity = count, capacity
        self.sent = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        import rabbitflow

        try:
            factory = rabbitflow.ConnectionFactory(self.url)
            with factory.create_connection() as connection:
                session = connection.create_session()
                producer = session.create_producer(
                    session.create_queue(self.queue), capacity=self.capacity
                )
                while self.count is None or self.sent < self.count:
                    producer.send(session.create_text_message(f"{self.pid}:{self.sent}"))
                    self.sent += 1
                session.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


def _raw(url: str, queue: str, pid: str) -> Any:
    return WindowProducer(url, queue, pid=pid, count=None, capacity=CAPACITIES[pid])


def _sdk(url: str, queue: str, pid: str) -> Any:
    return SdkProducer(url, queue, pid=pid, count=None, capacity=CAPACITIES[pid])


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_producer",
    [
        pytest.param(_sdk, id="rabbitflow-sdk"),
        pytest.param(_raw, id="raw-pika"),
    ],
)
def test_two_producers_block_at_stop_and_resume_below_resume(
    broker: Broker,
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    make_producer: Callable[[str, str, str], Any],
) -> None:
    queue = unique_name("qpid")
    cleanup_queues.append(queue)
    setup = gateway.connect()
    setup.channel().queue_declare(
        queue,
        durable=True,
        arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME},
    )
    setup.close()
    # The bound is on the queue as RabbitMQ holds it, not on the gateway's count.
    watcher = DepthWatcher(broker, queue)
    watcher.start()
    producers = [make_producer(gateway.url, queue, pid) for pid in CAPACITIES]
    for producer in producers:
        producer.start()

    blocked = wait_for(
        lambda: (q := gateway.queue(queue))["flowStopped"] and len(q["blockedChannels"]) == 2 and q,
        what="both producers' channels flowed",
    )
    assert STOP < blocked["messages"] <= STOP + sum(CAPACITIES.values())
    assert len(gateway.events("QUE-1003", queue)) == 1
    enforced = gateway.events("CHN-1005", queue)
    assert len(enforced) == 2
    assert len({(e["connection"], e["channel"]) for e in enforced}) == 2
    assert not any(p.done.is_set() for p in producers)
    wait_for(lambda: watcher.maximum > STOP, what="RabbitMQ holding more than the stop value")
    for producer in producers:
        producer.count = producer.sent + AFTER_BLOCK
    counts = {p.pid: p.count for p in producers}

    bodies = _drain(gateway, queue, sum(counts.values()))
    for producer in producers:
        wait_done(producer, timeout=60)
    deepest = watcher.finish()

    assert deepest <= STOP + sum(CAPACITIES.values())
    underfull = gateway.events("QUE-1004", queue)
    assert len(underfull) == 1
    assert underfull[0]["messages"] < RESUME
    removed = gateway.events("CHN-1006")
    assert sorted((e["connection"], e["channel"]) for e in removed) == sorted(
        (e["connection"], e["channel"]) for e in enforced
    )
    for pid, count in counts.items():
        mine = [int(b.split(b":")[1]) for b in bodies if b.startswith(pid.encode() + b":")]
        assert mine == list(range(count)), f"producer {pid}: lost, duplicated or reordered"
    final = gateway.queue(queue)
    assert final["flowStoppedCount"] == 1
    assert final["flowStopped"] is False
    del producers
    gc.collect()
