"""The gateway skips a queue's threshold machine while a depth change cannot
move it (the quiet window): it must give exactly the events and blocking a
machine fed every change would give, whatever the sequence of publishes,
removals, purges, reconciliations and threshold changes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rabbitflow_broker.engine.flow import QueueFlow
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
VHOST, QUEUE = "/", "q"
ROUTE = frozenset({QUEUE})


@st.composite
def _thresholds(draw: Any) -> dict[str, int]:
    stop_count = draw(st.integers(0, 12))
    stop_size = draw(st.sampled_from([0, 0, 50, 200]))
    return {
        "flowStopCount": stop_count,
        "flowResumeCount": draw(st.integers(0, stop_count)),
        "flowStopSize": stop_size,
        "flowResumeSize": draw(st.integers(0, stop_size)),
    }


_OPS = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 40)),
    st.tuples(st.just("remove"), st.integers(1, 3), st.integers(0, 60)),
    st.tuples(st.just("purge"), st.integers(0, 20)),
    st.tuples(st.just("reconcile"), st.integers(0, 20), st.integers(0, 300)),
    st.tuples(st.just("thresholds"), _thresholds()),
)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 10.0  # every reconciliation is past its settle time
        return self.t


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(_OPS, max_size=60), first=_thresholds())
def test_skipping_quiet_changes_matches_observing_every_change(
    ops: list[tuple[Any, ...]], first: dict[str, int]
) -> None:
    events: list[Event] = []
    gateway = Gateway(GatewayConfig(), sink=events.append, clock=lambda: NOW, monotonic=_Clock())
    gateway.queue_declared(VHOST, QUEUE, {})
    gateway.set_runtime_thresholds(VHOST, QUEUE, first)
    reference = QueueFlow(VHOST, QUEUE, gateway.flow((VHOST, QUEUE)).thresholds)
    expected: list[Event] = []
    key = (VHOST, QUEUE)

    def feed() -> None:
        depth = gateway.depth.get(key)
        event = reference.observe(depth.messages, depth.bytes, NOW)
        if event is not None:
            expected.append(event)

    feed()
    for op in ops:
        if op[0] == "publish":
            gateway.published(VHOST, ROUTE, op[1])
        elif op[0] == "remove":
            gateway.removed(VHOST, QUEUE, op[1], op[2])
        elif op[0] == "purge":
            gateway.purged(VHOST, QUEUE, op[1])
        elif op[0] == "reconcile":
            version = gateway.depth.version(key)
            gateway.reconcile(
                VHOST, QUEUE, messages=op[1], size=op[2], seen_version=version, settle=1.0
            )
        else:
            gateway.set_runtime_thresholds(VHOST, QUEUE, op[1])
            reference.thresholds = gateway.flow(key).thresholds
        feed()
        assert gateway.is_blocked(VHOST, QUEUE) == reference.stopped
        assert gateway.route_blocker(VHOST)(ROUTE) == reference.stopped
        assert events == expected


def test_a_quiet_queue_is_not_fed_to_its_machine() -> None:
    """Far from its thresholds a publish does not reach the machine (the point of the window)."""
    gateway = Gateway(GatewayConfig(), sink=lambda e: None, clock=lambda: NOW)
    gateway.queue_declared(VHOST, QUEUE, {"qpid.flow_stop_count": 1000})
    gateway.published(VHOST, ROUTE, 10)
    machine = gateway.flow((VHOST, QUEUE))
    calls: list[tuple[Any, ...]] = []
    original = machine.observe

    def counting(*args: Any) -> Any:
        calls.append(args)
        return original(*args)

    machine.observe = counting  # type: ignore[method-assign,assignment]
    for _ in range(873):
        gateway.published(VHOST, ROUTE, 10)
    assert calls == []  # 874: under the derived resume count (875)
    assert gateway.hot_queues() == []
    gateway.published(VHOST, ROUTE, 10)  # 875: reaches resume, near its stop
    assert len(calls) == 1
    assert gateway.hot_queues() == [(VHOST, QUEUE)]
    for _ in range(125):
        gateway.published(VHOST, ROUTE, 10)  # up to 1,000: not over stop, quiet again
    assert len(calls) == 1
    gateway.published(VHOST, ROUTE, 10)  # 1,001: over stop
    assert len(calls) == 2
    assert gateway.is_blocked(VHOST, QUEUE)


def test_a_queue_leaves_the_hot_set_when_it_drains_under_resume() -> None:
    gateway = Gateway(GatewayConfig(), sink=lambda e: None, clock=lambda: NOW)
    gateway.queue_declared(VHOST, QUEUE, {"qpid.flow_stop_count": 10})  # resume 8 (derived)
    for _ in range(11):
        gateway.published(VHOST, ROUTE, 10)
    assert gateway.hot_queues() == [(VHOST, QUEUE)]  # ON
    gateway.removed(VHOST, QUEUE, 3, 30)  # 8: still not under resume
    assert gateway.hot_queues() == [(VHOST, QUEUE)]
    gateway.removed(VHOST, QUEUE, 1, 10)  # 7: OFF and under resume
    assert not gateway.is_blocked(VHOST, QUEUE)
    assert gateway.hot_queues() == []
