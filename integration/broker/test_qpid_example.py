"""Issue 3 item 1: the Qpid example, two producers against stop 100 / resume 50."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from integration.broker._producers import WindowProducer, wait_done
from integration.broker.conftest import RunningGateway, wait_for

STOP, RESUME = 100, 50
CAPACITIES = {"a": 50, "b": 15}
# Enough that each producer is certainly blocked (more than 100 + its capacity
# could be confirmed before), few enough that the drained queue cannot refill
# past the stop threshold once the consumer runs.
COUNTS = {"a": 160, "b": 120}


class DepthSampler(threading.Thread):
    """Samples the gateway's depth of one queue until stopped; keeps the maximum."""

    def __init__(self, gateway: RunningGateway, queue: str) -> None:
        super().__init__(daemon=True)
        self.gateway, self.queue = gateway, queue
        self.peak = 0
        self.halt = threading.Event()

    def run(self) -> None:
        service = self.gateway.service
        assert service is not None
        key = ("/", self.queue)
        while not self.halt.wait(0.002):
            depth = self.gateway.call(lambda: service.gateway.depth.get(key).messages)
            self.peak = max(self.peak, depth)


def _drain(gateway: RunningGateway, queue: str, expected: int) -> list[bytes]:
    connection = gateway.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=200)
    bodies: list[bytes] = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=30):
        assert method is not None, f"only {len(bodies)} of {expected} messages arrived"
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == expected:
            break
    channel.cancel()
    connection.close()
    return bodies


@pytest.mark.slow
def test_two_producers_block_at_stop_and_resume_below_resume(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
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
    sampler = DepthSampler(gateway, queue)
    sampler.start()
    producers = [
        WindowProducer(gateway.url, queue, pid=pid, count=COUNTS[pid], capacity=CAPACITIES[pid])
        for pid in CAPACITIES
    ]
    for producer in producers:
        producer.start()

    blocked = wait_for(
        lambda: (
            (q := gateway.queue(queue))["flowStopped"]
            and len(q["blockedChannels"]) == 2
            and all(p.flowed for p in producers)
            and q
        ),
        what="both producers flowed",
    )
    assert STOP < blocked["messages"] <= STOP + sum(CAPACITIES.values())
    assert len(gateway.events("QUE-1003", queue)) == 1
    enforced = gateway.events("CHN-1005", queue)
    assert len(enforced) == 2
    assert len({(e["connection"], e["channel"]) for e in enforced}) == 2

    bodies = _drain(gateway, queue, sum(COUNTS.values()))
    for producer in producers:
        wait_done(producer, timeout=60)
    sampler.halt.set()
    sampler.join()

    assert sampler.peak <= STOP + sum(CAPACITIES.values())
    assert all(p.max_unconfirmed <= p.capacity for p in producers)
    underfull = gateway.events("QUE-1004", queue)
    assert len(underfull) == 1
    assert underfull[0]["messages"] < RESUME
    removed = gateway.events("CHN-1006")
    assert sorted((e["connection"], e["channel"]) for e in removed) == sorted(
        (e["connection"], e["channel"]) for e in enforced
    )
    for pid, count in COUNTS.items():
        mine = [int(b.split(b":")[1]) for b in bodies if b.startswith(pid.encode() + b":")]
        assert mine == list(range(count)), f"producer {pid}: lost, duplicated or reordered"
    final = gateway.queue(queue)
    assert final["flowStoppedCount"] == 1
    assert final["flowStopped"] is False
