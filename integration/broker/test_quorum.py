"""Quorum queues through the gateway: flow control holds as on classic queues.

RabbitMQ 3.10's management API lists a quorum queue's ``messages`` as 0
(or null) with statistics disabled; the gateway must never adopt that.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest

from integration.broker._depth import DepthWatcher
from integration.broker._producers import WindowProducer, wait_done
from integration.broker.conftest import RunningGateway, wait_for
from integration.broker.test_qpid_example import (
    AFTER_BLOCK,
    CAPACITIES,
    RESUME,
    STOP,
    _raw,
    _sdk,
)
from integration.broker.test_qpid_example import _drain as drain_no_ack
from integration.conftest import Broker
from rabbitflow_broker.hub.depth_sources import STATS_SETTLE_S

QUORUM = {"x-queue-type": "quorum"}
THRESHOLDS = {"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME}
#: RabbitMQ's statistics interval (collect_statistics_interval, 5 s by default).
STATISTICS_INTERVAL_S = 5.0
#: How long a held quorum queue is watched: a statistics count is adopted only
#: after the gateway left the queue alone STATS_SETTLE_S, and may be one
#: interval old; two intervals more and a margin let a wrong count show.
HOLD_S = 30.0
assert HOLD_S > STATS_SETTLE_S + 2 * STATISTICS_INTERVAL_S + 2


def _declare(gateway: RunningGateway, name: str, arguments: dict[str, Any]) -> None:
    connection = gateway.connect()
    connection.channel().queue_declare(name, durable=True, arguments=arguments)
    connection.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_producer",
    [
        pytest.param(_sdk, id="rabbitflow-sdk"),
        pytest.param(_raw, id="raw-pika"),
    ],
)
def test_qpid_example_on_a_quorum_queue_keeps_the_bound_and_every_message(
    broker: Broker,
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    make_producer: Callable[[str, str, str], Any],
) -> None:
    queue = unique_name("quorum-qpid")
    cleanup_queues.append(queue)
    _declare(gateway, queue, {**QUORUM, **THRESHOLDS})
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
    wait_for(lambda: watcher.maximum > STOP, what="RabbitMQ holding more than the stop value")
    # That no statistics reading frees a held quorum queue is shown by
    # test_quorum_queue_without_consumer_stays_on_for_30_seconds below, which
    # holds it past the time such a reading takes to be adopted.
    for producer in producers:
        producer.count = producer.sent + AFTER_BLOCK
    counts = {p.pid: p.count for p in producers}

    bodies = drain_no_ack(gateway, queue, sum(c for c in counts.values() if c is not None))
    for producer in producers:
        wait_done(producer, timeout=60)
    deepest = watcher.finish()

    assert deepest <= STOP + sum(CAPACITIES.values())
    assert len(gateway.events("QUE-1003", queue)) == 1
    underfull = gateway.events("QUE-1004", queue)
    assert len(underfull) == 1
    assert underfull[0]["messages"] < RESUME
    for pid, count in counts.items():
        mine = [int(b.split(b":")[1]) for b in bodies if b.startswith(pid.encode() + b":")]
        assert mine == list(range(count or 0)), f"producer {pid}: lost, duplicated or reordered"
    assert gateway.queue(queue)["flowStopped"] is False
    del producers
    gc.collect()


@pytest.mark.slow
def test_quorum_queue_without_consumer_stays_on_for_30_seconds(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("quorum-hold")
    cleanup_queues.append(queue)
    _declare(gateway, queue, {**QUORUM, **THRESHOLDS})
    producer = WindowProducer(gateway.url, queue, pid="p", count=None, capacity=10)
    producer.start()
    try:
        wait_for(lambda: gateway.queue(queue)["flowStopped"], what="queue flow-stopped")
        samples: list[tuple[bool, int]] = []
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:
            info = gateway.queue(queue)
            samples.append((info["flowStopped"], info["messages"]))
            time.sleep(0.2)
    finally:
        producer.stop()
        producer.join(timeout=10)
    assert all(stopped for stopped, _ in samples), [s for s in samples if not s[0]][:3]
    assert min(messages for _, messages in samples) > STOP
    assert gateway.events("QUE-1004", queue) == []
    assert producer.confirmed <= STOP
    assert producer.sent <= STOP + 10


@pytest.mark.slow
@pytest.mark.parametrize(
    "dead_lettering",
    [
        pytest.param({}, id="at-most-once"),
        pytest.param(
            {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
            id="at-least-once",
        ),
    ],
)
def test_delivery_limit_and_dead_letter_target_depths_are_tracked(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    dead_lettering: dict[str, str],
) -> None:
    source, target = unique_name("quorum-dl"), unique_name("quorum-dlx")
    cleanup_queues.extend([source, target])
    _declare(gateway, target, dict(QUORUM))
    _declare(
        gateway,
        source,
        {
            **QUORUM,
            **dead_lettering,
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": target,
        },
    )
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(5):
        channel.basic_publish("", source, f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
    assert gateway.queue(source)["messages"] == 5
    # Reject with requeue until RabbitMQ dead-letters each message (over the limit).
    channel.basic_qos(prefetch_count=5)
    rejected = 0
    deadline = time.monotonic() + 30
    for method, _props, _body in channel.consume(source, inactivity_timeout=2):
        if method is None:
            if time.monotonic() > deadline or rejected >= 10:
                break
            continue
        channel.basic_nack(method.delivery_tag, requeue=True)
        rejected += 1
    channel.cancel()
    connection.close()
    # Five deliveries and one redelivery each: 10 rejections, then dead-lettered.
    assert rejected == 10

    def tracked() -> tuple[int, int] | None:
        depths = (gateway.queue(source)["messages"], gateway.queue(target)["messages"])
        return depths if depths == (0, 5) else None

    assert wait_for(tracked, timeout=60, interval=0.5, what="source 0 and target 5 messages")
    consumer = gateway.connect()
    got = [consumer.channel().basic_get(target, auto_ack=True)[2] for _ in range(5)]
    consumer.close()
    assert sorted(got) == [f"m{n}".encode() for n in range(5)]


def test_reject_publish_overflow_is_subtracted_at_once_without_reconciliation(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(reconcile_interval=0)  # only what the gateway relays counts
    queue = unique_name("quorum-reject")
    cleanup_queues.append(queue)
    # Flow control off, so every publish is answered at once.
    _declare(
        gateway,
        queue,
        {
            **QUORUM,
            "x-max-length": 10,
            "x-overflow": "reject-publish",
            "qpid.flow_stop_count": 0,
            "qpid.flow_stop_size": 0,
        },
    )
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    refused = 0
    for n in range(15):
        try:
            channel.basic_publish("", queue, b"%d" % n)
        except pika.exceptions.NackError:
            refused += 1
    held = channel.queue_declare(queue, passive=True).method.message_count
    connection.close()
    # A quorum queue's limit is soft (it may take one past it): ask RabbitMQ.
    assert refused >= 4
    assert gateway.queue(queue)["messages"] == 15 - refused == held


@pytest.mark.slow
def test_drop_head_overflow_depth_is_reconciled(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("quorum-drop")
    cleanup_queues.append(queue)
    _declare(gateway, queue, {**QUORUM, "x-max-length": 10})  # drop-head: no thresholds
    assert gateway.queue(queue)["source"] == "none"
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(15):
        channel.basic_publish("", queue, b"%d" % n)
    connection.close()
    # RabbitMQ dropped the five oldest; the gateway learns it from the statistics.
    assert wait_for(
        lambda: gateway.queue(queue)["messages"] == 10,
        timeout=60,
        interval=0.5,
        what="depth reconciled to the 10 RabbitMQ keeps",
    )
