"""Three gateways, one flow state: the bound holds whichever member producers use.

Each member is its own ``rabbitflow-broker --cluster NAME`` process in front
of the shared RabbitMQ; the queue's depth is sampled from RabbitMQ itself.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest

from integration.broker._depth import DepthWatcher
from integration.broker._producers import WindowProducer
from integration.broker.conftest import wait_for
from integration.cluster._members import Member
from integration.conftest import Broker

STOP, RESUME = 300, 150
BATCH = 20
LEASE_MS = 1000
CAPACITY = 10
PRODUCERS_PER_MEMBER = 2
RESUME_CONFIRMS = 20  # confirms each producer gets to count as resumed


class SlowConsumer(threading.Thread):
    """Consumes straight from RabbitMQ, acking one message every ``pause`` seconds."""

    def __init__(self, broker: Broker, queue: str, pause: float) -> None:
        super().__init__(daemon=True)
        self.broker, self.queue, self.pause = broker, queue, pause
        self.bodies: list[bytes] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = self.broker.blocking_connection()
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1)
            for method, _props, body in channel.consume(self.queue, inactivity_timeout=0.05):
                if method is not None:
                    self.bodies.append(body)
                    channel.basic_ack(method.delivery_tag)
                    time.sleep(self.pause)
                if self.halt.is_set():
                    break
            channel.cancel()
            connection.close()
        except BaseException as exc:
            self.error = exc

    def seconds_per_message(self, count: int) -> float:
        """Its pace over its next ``count`` messages (call it while the queue is full)."""
        first, started = len(self.bodies), time.monotonic()
        wait_for(
            lambda: len(self.bodies) >= first + count,
            timeout=30,
            interval=0.01,
            what=f"the consumer to take {count} messages",
        )
        return (time.monotonic() - started) / count


def _ready_cluster(members: list[Member]) -> str:
    """Wait until every member sees all of them and one owner; return the owner id."""

    def agreed() -> str | None:
        views = [m.cluster_view() for m in members]
        owners = {v["owner"] for v in views}
        if (
            len(owners) == 1
            and None not in owners
            and all(len(v["members"]) == len(members) for v in views)
        ):
            return str(owners.pop())
        return None

    return str(wait_for(agreed, timeout=30, interval=0.1, what="one owner seen by every member"))


def _declare(member: Member, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(member.url))
    try:
        connection.channel().queue_declare(
            queue,
            arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME},
        )
    finally:
        connection.close()


def _run_producers(members: list[Member], queue: str) -> list[WindowProducer]:
    producers = [
        WindowProducer(m.url, queue, pid=f"{m.index}.{i}", count=None, capacity=CAPACITY)
        for m in members
        for i in range(PRODUCERS_PER_MEMBER)
    ]
    for producer in producers:
        producer.start()
    return producers


def _wait_flow_stopped_everywhere(members: list[Member], queue: str) -> None:
    wait_for(
        lambda: all(
            m.http("GET", f"/api/queues/%2F/{queue}")[1].get("flowStopped") is True for m in members
        ),
        timeout=30,
        what="flowStopped on every member",
    )


def _check(producers: list[WindowProducer]) -> None:
    for producer in producers:
        assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"


def _finish(producers: list[WindowProducer]) -> None:
    for producer in producers:
        producer.stop()
    for producer in producers:
        assert producer.done.wait(20), f"producer {producer.pid} did not stop"
        assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"


def _owner(members: list[Member], owner_id: str) -> Member:
    for member in members:
        if member.cluster_view()["member"] == owner_id:
            return member
    raise AssertionError(f"no member is {owner_id}")


def _watched(broker: Broker, member: Member, queue: str) -> DepthWatcher:
    """Declare ``queue`` through ``member`` and sample its depth in RabbitMQ."""
    _declare(member, queue)
    watcher = DepthWatcher(broker, queue)
    watcher.start()
    return watcher


def _bound(producers: list[Any], members: list[Member]) -> int:
    """stop + sum(c) + M x batch."""
    return STOP + len(producers) * CAPACITY + len(members) * BATCH


def _assert_bound(watcher: DepthWatcher, producers: list[Any], members: list[Member]) -> int:
    """The peak depth RabbitMQ had, within stop + sum(c) + M x batch."""
    peak = watcher.finish()
    bound = _bound(producers, members)
    print(f"peak depth {peak}, bound {bound}")  # shown with -s
    assert peak <= bound, f"peak depth {peak} over stop + sum(c) + M x batch = {bound}"
    return peak


@pytest.mark.slow
def test_declared_through_one_member_governed_on_all_and_bound_holds(
    broker: Broker,
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    members = cluster_members(3, cluster_batch=BATCH, cluster_lease=LEASE_MS)
    owner_id = _ready_cluster(members)
    queue = new_queue("cluster")
    watcher = _watched(broker, members[0], queue)  # the others learn it from the cluster
    producers = _run_producers(members, queue)
    consumer = SlowConsumer(broker, queue, pause=0.004)
    try:
        # The queue is overfull on every member, whichever one declared it.
        _wait_flow_stopped_everywhere(members, queue)
        _check(producers)
        marks = {p.pid: p.confirmed for p in producers}
        consumer.start()
        # The consumer drains below resume: released everywhere, every producer goes on.
        wait_for(
            lambda: all(p.confirmed > marks[p.pid] + CAPACITY for p in producers),
            timeout=30,
            what="every producer confirmed again after the release",
        )
        _check(producers)
    finally:
        _finish(producers)
        consumer.halt.set()
        consumer.join(10)
    peak = _assert_bound(watcher, producers, members)
    assert peak > STOP, f"the queue never reached its stop threshold ({peak})"
    # Each transition was logged once in the cluster, by the owner, with its id.
    overfull = [e for m in members for e in m.events("QUE-1003") if e.get("queue") == queue]
    underfull = [e for m in members for e in m.events("QUE-1004") if e.get("queue") == queue]
    assert overfull, "no QUE-1003 logged"
    assert {e["gateway"] for e in overfull + underfull} == {owner_id}
    assert len(overfull) - len(underfull) in (0, 1), (len(overfull), len(underfull))


@pytest.mark.slow
def test_owner_killed_bound_holds_and_producers_resume_within_lease(
    broker: Broker,
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    members = cluster_members(3, cluster_batch=BATCH, cluster_lease=LEASE_MS)
    owner_id = _ready_cluster(members)
    owner = _owner(members, owner_id)
    others = [m for m in members if m is not owner]
    queue = new_queue("cluster")
    watcher = _watched(broker, others[0], queue)
    consumer = SlowConsumer(broker, queue, pause=0.002)
    consumer.start()
    producers = _run_producers(others, queue)
    try:
        wait_for(lambda: all(p.confirmed > 50 for p in producers), timeout=30, what="flowing")
        pace = consumer.seconds_per_message(100)
        owner.kill()
        killed_at = time.monotonic()
        before = {p.pid: p.confirmed for p in producers}
        # A new owner (one of the others) takes over and grants after one lease.
        # If the queue is flow-stopped then, producers wait for the consumer
        # to drain it to its resume threshold (at most the bound), and each
        # needs RESUME_CONFIRMS more confirms: that is the consumer's time,
        # not the cluster's, so the budget counts it at the consumer's pace.
        wait_for(
            lambda: all(p.confirmed > before[p.pid] + RESUME_CONFIRMS for p in producers),
            timeout=30,
            what="producers confirmed again after the owner's death",
        )
        resumed_after = time.monotonic() - killed_at
        # Grants the dead owner made may carry producers a little way before
        # the new owner is elected: wait for the survivors to name it.
        wait_for(
            lambda: all(m.cluster_view()["owner"] not in (owner_id, None) for m in others),
            timeout=LEASE_MS / 1000 + 5,
            what="the surviving members to name a new owner",
        )
    finally:
        _finish(producers)
        consumer.halt.set()
        consumer.join(10)
    _assert_bound(watcher, producers, members)
    drained = _bound(producers, members) - RESUME + len(producers) * RESUME_CONFIRMS
    lease_s = LEASE_MS / 1000
    budget = lease_s + drained * pace + 1.5
    # Shown with -s.
    print(
        f"owner killed: resumed after {resumed_after:.2f} s, "
        f"budget {budget:.2f} s, lease {lease_s:g} s"
    )
    assert resumed_after <= budget, (
        f"resumed {resumed_after:.2f} s after the kill, budget {budget:.2f} s "
        f"(the consumer took {pace * 1000:.1f} ms a message)"
    )


@pytest.mark.slow
def test_stopped_member_holds_completions_and_rejoins(
    broker: Broker,
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    members = cluster_members(3, cluster_batch=BATCH, cluster_lease=LEASE_MS)
    owner_id = _ready_cluster(members)
    queue = new_queue("cluster")
    watcher = _watched(broker, members[0], queue)
    consumer = SlowConsumer(broker, queue, pause=0.004)
    consumer.start()
    producers = _run_producers(members, queue)
    frozen = members[1] if members[1].cluster_view()["member"] != owner_id else members[2]
    frozen_id = frozen.cluster_view()["member"]
    try:
        wait_for(lambda: all(p.confirmed > 50 for p in producers), timeout=30, what="flowing")
        frozen.signal(signal.SIGSTOP)
        time.sleep(5)  # the scenario itself: a member frozen for 5 s
        frozen.signal(signal.SIGCONT)
        # It comes back to the cluster (a new bus connection) and its producers go on.
        wait_for(
            lambda: (
                frozen_id
                in {m["id"] for m in members[0].cluster_view()["members"] if m["lastSeenMs"] < 1000}
            ),
            timeout=20,
            what="the frozen member seen again",
        )
        mine = [p for p in producers if p.pid.startswith(f"{frozen.index}.")]
        marks = {p.pid: p.confirmed for p in mine}
        wait_for(
            lambda: all(p.confirmed > marks[p.pid] + 20 for p in mine),
            timeout=20,
            what="the frozen member's producers confirmed again",
        )
    finally:
        _finish(producers)
        consumer.halt.set()
        consumer.join(10)
    _assert_bound(watcher, producers, members)


#: Messages each producer of the failover scenario sends: enough that all are
#: still sending when a member is killed (checked).
FAILOVER_COUNT = 800


class FailoverProducer(threading.Thread):
    """An SDK producer given every member, its own first; records what send() accepted."""

    def __init__(self, urls: list[str], queue: str, pid: str, count: int) -> None:
        super().__init__(daemon=True)
        self.urls, self.queue, self.pid, self.count = urls, queue, pid, count
        self.accepted: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        import rabbitflow

        try:
            factory = rabbitflow.ConnectionFactory(
                "failover:(" + ",".join(self.urls) + ")",
                properties={"qpid.flow_control_wait_failure": 60_000},
            )
            with factory.create_connection() as connection:
                session = connection.create_session()
                producer = session.create_producer(
                    session.create_queue(self.queue), capacity=CAPACITY
                )
                for seq in range(self.count):
                    body = f"{self.pid}:{seq}"
                    producer.send(session.create_text_message(body))
                    self.accepted.append(body)
                session.close()
        except BaseException as exc:
            self.error = exc


@pytest.mark.slow
def test_member_killed_its_producers_fail_over_nothing_lost_bound_holds(
    broker: Broker,
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    members = cluster_members(3, cluster_batch=BATCH, cluster_lease=LEASE_MS)
    owner_id = _ready_cluster(members)
    victim = next(m for m in members if m.cluster_view()["member"] != owner_id)
    queue = new_queue("cluster")
    watcher = _watched(broker, members[0], queue)
    consumer = SlowConsumer(broker, queue, pause=0.002)
    consumer.start()
    producers = []
    for member in members:
        # Each producer's own member first, then the others.
        urls = [member.url] + [m.url for m in members if m is not member]
        producers += [
            FailoverProducer(urls, queue, f"{member.index}.{i}", FAILOVER_COUNT) for i in range(2)
        ]
    for producer in producers:
        producer.start()
    try:
        wait_for(lambda: all(len(p.accepted) > 100 for p in producers), timeout=60, what="flowing")
        victim.kill()  # mid-stream: its producers move to the other members
        # Held by flow control at the consumer's pace, none had finished.
        assert all(len(p.accepted) < FAILOVER_COUNT for p in producers), "too few messages"
        for producer in producers:
            producer.join(120)
            assert not producer.is_alive(), f"producer {producer.pid} still sending"
            assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"
        accepted = {body for p in producers for body in p.accepted}
        assert len(accepted) == len(producers) * FAILOVER_COUNT
        wait_for(
            lambda: accepted <= {b.decode() for b in consumer.bodies},
            timeout=60,
            interval=0.2,
            what="every accepted message consumed",
        )
    finally:
        consumer.halt.set()
        consumer.join(10)
    _assert_bound(watcher, producers, members)


@pytest.mark.slow
def test_thresholds_and_administrator_stops_apply_on_every_member_within_a_second(
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    members = cluster_members(3, cluster_batch=BATCH, cluster_lease=LEASE_MS)
    _ready_cluster(members)
    queue = new_queue("cluster")
    _declare(members[0], queue)
    path = f"/api/queues/%2F/{queue}"
    status, body = members[1].http("PUT", f"{path}/flow", {"flowStopCount": 5000})
    assert status == 200, body
    changed = time.monotonic()
    wait_for(
        lambda: all(m.http("GET", path)[1].get("flowStopCount") == 5000 for m in members),
        timeout=5,
        interval=0.02,
        what="the new threshold on every member",
    )
    assert time.monotonic() - changed <= 1.0
    status, body = members[2].http("POST", "/api/producers/stop", {"queue": queue})
    assert status == 200, body
    stopped = time.monotonic()
    # A producer on another member is held: its channel flowed, nothing confirmed.
    producer = WindowProducer(members[0].url, queue, pid="p", count=None, capacity=CAPACITY)
    producer.start()
    try:
        wait_for(lambda: False in producer.flow_changes, timeout=5, what="producer flowed")
        assert time.monotonic() - stopped <= 1.5
        assert producer.confirmed == 0
        status, body = members[1].http("POST", "/api/producers/start", {"queue": queue})
        assert status == 200, body
        wait_for(lambda: producer.confirmed >= CAPACITY, timeout=5, what="released everywhere")
    finally:
        _finish([producer])


#: How far two members' depths of one queue may differ: what one round of
#: reports or expired grants may move the owner's count by (a batch per member).
DEPTH_TOLERANCE = 2 * BATCH


def _listed(member: Member, queue: str) -> dict[str, Any]:
    status, body = member.http("GET", "/api/queues")
    assert status == 200, body
    return dict(next(q for q in body if q["name"] == queue))


@pytest.mark.slow
def test_every_member_lists_the_cluster_wide_depth_and_flow_state(
    cluster_members: Callable[..., list[Member]],
    new_queue: Callable[[str], str],
) -> None:
    """While a queue is flowed, /api/queues on a member that does not own its
    accounting shows the owner's flow state, flowStoppedCount and depth (within
    DEPTH_TOLERANCE).  RabbitMQ's own counts are asked for only once a minute
    here, so what each member shows comes from the cluster: a member alone
    counts only what its own producers sent."""
    members = cluster_members(
        2,
        cluster_batch=BATCH,
        cluster_lease=LEASE_MS,
        reconcile_interval=60_000,
        depth_poll_interval=60_000,
    )
    owner = _owner(members, _ready_cluster(members))
    other = next(m for m in members if m is not owner)
    queue = new_queue("cluster")
    _declare(other, queue)
    producers = _run_producers(members, queue)  # through both members

    seen: list[dict[str, Any]] = []

    def agreed() -> bool:
        mine, theirs = _listed(owner, queue), _listed(other, queue)
        seen[:] = [mine, theirs]
        return bool(
            mine["flowStopped"] is theirs["flowStopped"] is True
            and mine["flowStoppedCount"] == theirs["flowStoppedCount"]
            and abs(mine["messages"] - theirs["messages"]) <= DEPTH_TOLERANCE
        )

    try:
        _wait_flow_stopped_everywhere(members, queue)
        _check(producers)
        # Flowed: the producers wait, and every member shows the owner's figures.
        for _ in range(10):
            try:
                wait_for(agreed, timeout=2, interval=0.05)
            except pytest.fail.Exception:
                pytest.fail(f"the members disagree: the owner lists {seen[0]}, the other {seen[1]}")
            assert seen[1]["messages"] > STOP, seen  # over its stop threshold, as the owner says
            time.sleep(0.1)  # the next sample: a later round of the owner's
    finally:
        _finish(producers)
