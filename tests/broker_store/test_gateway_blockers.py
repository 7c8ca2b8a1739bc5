"""Gateway: administrator stops and the store quota as independent blockers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from rabbitflow_broker.events import ALL_QUEUES, Event, StoreOverfull, StoreUnderfull
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from tests.broker.fakes import IdleConnection

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
Q = frozenset({"q"})


def _gateway(**options: Any) -> tuple[Gateway, list[Event]]:
    events: list[Event] = []
    gateway = Gateway(
        GatewayConfig(**options), sink=events.append, clock=lambda: NOW, monotonic=lambda: 0.0
    )
    return gateway, events


def test_stop_all_blocks_every_vhost_with_all_queues() -> None:
    gateway, _ = _gateway()
    gateway.stop_producers()
    assert gateway.blockers("/", Q) == [ALL_QUEUES]
    assert gateway.blockers("other", frozenset()) == [ALL_QUEUES]
    assert gateway.route_blocker("other")(frozenset())


def test_stop_one_vhost_leaves_others_free() -> None:
    gateway, _ = _gateway()
    gateway.stop_producers(vhost="a")
    assert gateway.vhost_blocked("a")
    assert not gateway.vhost_blocked("b")


def test_stop_one_queue_names_the_queue_not_all_queues() -> None:
    gateway, _ = _gateway()
    gateway.stop_producers(vhost="/", queue="q")
    assert gateway.blockers("/", frozenset({"q", "r"})) == ["q"]
    assert gateway.route_blocker("/")(Q)
    assert not gateway.route_blocker("/")(frozenset({"r"}))
    assert not gateway.vhost_blocked("/")


def test_stop_queue_without_vhost_applies_in_every_vhost() -> None:
    gateway, _ = _gateway()
    gateway.stop_producers(queue="q")
    assert gateway.is_blocked("/", "q")
    assert gateway.is_blocked("v2", "q")


def test_start_lifts_only_the_matching_stop() -> None:
    gateway, _ = _gateway()
    gateway.stop_producers(vhost="/")
    gateway.stop_producers(vhost="/", queue="q")
    gateway.start_producers(vhost="/")
    assert gateway.admin_stops() == [{"vhost": "/", "queue": "q"}]
    assert gateway.blocker_active("/", "q")
    assert not gateway.blocker_active("/", ALL_QUEUES)


def test_stop_and_start_report_a_change_for_every_vhost() -> None:
    gateway, _ = _gateway()
    gateway.on_change = lambda: None
    gateway.stop_producers()
    stopped = gateway.take_changes()
    assert stopped is not None
    assert stopped.concerns("/")
    gateway.start_producers()
    started = gateway.take_changes()
    assert started is not None
    assert started.concerns("any")


def test_starting_what_was_not_stopped_changes_nothing() -> None:
    gateway, _ = _gateway()
    calls: list[None] = []
    gateway.on_change = lambda: calls.append(None)
    gateway.start_producers(vhost="/")
    assert gateway.take_changes() is None
    assert calls == []


def test_store_overfull_blocks_the_vhost_and_logs_mst_1008() -> None:
    gateway, events = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.store_quotas.observe("/", 1500, "management")
    assert [type(e) for e in events] == [StoreOverfull]
    assert gateway.blockers("/", Q) == [ALL_QUEUES]


def test_store_underfull_frees_the_vhost_and_logs_mst_1009() -> None:
    gateway, events = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.store_quotas.observe("/", 1500, "management")
    gateway.store_quotas.observe("/", 100, "management")
    assert [type(e) for e in events] == [StoreOverfull, StoreUnderfull]
    assert not gateway.vhost_blocked("/")


def test_admin_stop_holds_after_the_store_clears() -> None:
    gateway, _ = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.store_quotas.observe("/", 1500, "management")
    gateway.stop_producers(vhost="/")
    gateway.store_quotas.observe("/", 100, "management")
    assert gateway.vhost_blocked("/")


def test_store_block_holds_after_admin_start() -> None:
    gateway, _ = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.stop_producers(vhost="/")
    gateway.store_quotas.observe("/", 1500, "management")
    gateway.start_producers(vhost="/")
    assert gateway.vhost_blocked("/")


def test_store_snapshots_list_measured_vhosts() -> None:
    gateway, _ = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.store_quotas.observe("b", 10, "disk")
    gateway.store_quotas.observe("a", 2000, "disk")
    snaps = gateway.store_quotas.snapshots()
    assert [(s.vhost, s.overfull, s.source) for s in snaps] == [
        ("a", True, "disk"),
        ("b", False, "disk"),
    ]


def test_held_confirms_sums_the_connections() -> None:
    gateway, _ = _gateway()
    first, second = IdleConnection(1, held=3), IdleConnection(2, held=4)
    gateway.register(first)
    gateway.register(second)
    assert gateway.held_confirms() == 7


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _quota_gateway() -> tuple[Gateway, list[Event], Clock]:
    events: list[Event] = []
    clock = Clock()
    gateway = Gateway(
        GatewayConfig(store_overfull_size=1000, store_underfull_size=500),
        sink=events.append,
        clock=lambda: NOW,
        monotonic=clock,
    )
    return gateway, events, clock


def test_persistent_publishes_cross_the_quota_before_the_next_measurement() -> None:
    gateway, events, _ = _quota_gateway()
    gateway.store_quotas.observe("/", 900, "management")
    gateway.persistent_published("/", 101)
    assert [type(e) for e in events] == [StoreOverfull]
    assert gateway.vhost_blocked("/")


def test_published_bytes_count_only_within_the_staleness_window() -> None:
    gateway, events, clock = _quota_gateway()
    gateway.persistent_published("/", 600)
    clock.t += 6.5  # older than 5 s statistics + 1 s poll
    gateway.persistent_published("/", 600)
    assert events == []


def test_disk_measurements_have_a_shorter_window() -> None:
    gateway, events, clock = _quota_gateway()
    gateway.store_quotas.observe("/", 0, "disk")
    gateway.persistent_published("/", 600)
    clock.t += 1.5
    gateway.persistent_published("/", 600)
    assert events == []


def test_measurement_below_underfull_clears_once_recent_bytes_age_out() -> None:
    gateway, events, clock = _quota_gateway()
    gateway.persistent_published("/", 1500)
    clock.t += 7
    gateway.store_quotas.observe("/", 100, "management")
    assert [type(e) for e in events] == [StoreOverfull, StoreUnderfull]


def test_persistent_bytes_are_ignored_with_the_quota_off() -> None:
    gateway, events = _gateway()
    gateway.persistent_published("/", 10**9)
    assert gateway.store_quotas.snapshots() == []
    assert events == []


def test_calm_holds_exactly_while_nothing_blocks_any_producer() -> None:
    gateway, _ = _gateway(store_overfull_size=1000, store_underfull_size=500)
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 2, "qpid.flow_resume_count": 1})
    assert gateway.calm

    def fill() -> None:
        for _ in range(3):
            gateway.published("/", Q, 1)

    steps: list[tuple[Callable[[], None], Callable[[], None]]] = [
        (gateway.stop_producers, gateway.start_producers),
        (lambda: gateway.stop_producers(vhost="a"), lambda: gateway.start_producers(vhost="a")),
        (lambda: gateway.stop_producers(queue="q"), lambda: gateway.start_producers(queue="q")),
        (
            lambda: gateway.set_vhost_blocked("v", blocked=True),
            lambda: gateway.set_vhost_blocked("v", blocked=False),
        ),
        (
            lambda: gateway.store_quotas.observe("/", 1500, "management"),
            lambda: gateway.store_quotas.observe("/", 100, "management"),
        ),
        (fill, lambda: gateway.removed("/", "q", 3, 3)),
    ]
    for block, unblock in steps:
        block()
        assert not gateway.calm
        assert gateway.blockers("/", Q) or gateway.blockers("a", Q) or gateway.blockers("v", Q)
        unblock()
        assert gateway.calm
        assert not any(gateway.blockers(vhost, Q) for vhost in ("/", "a", "v"))
