"""Shared gateway state: depth to events, blocking, runtime thresholds."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import pytest

from rabbitflow_broker.config import GatewayConfig
from rabbitflow_broker.events import ALL_QUEUES, Event, QueueOverfull, QueueUnderfull
from rabbitflow_broker.flow import ThresholdError
from rabbitflow_broker.gateway import BlockedChannel, Gateway

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STOP_10 = {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.refreshes = 0

    def refresh(self) -> None:
        self.refreshes += 1

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        return []

    def channel_count(self) -> int:
        return 0

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        return []


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _gateway(**options: Any) -> tuple[Gateway, list[Event]]:
    events: list[Event] = []
    gateway = Gateway(
        GatewayConfig(**options), sink=events.append, clock=lambda: NOW, monotonic=Clock()
    )
    return gateway, events


def test_publishes_over_stop_emit_one_overfull() -> None:
    gateway, events = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    for _ in range(12):
        gateway.published("/", frozenset({"q"}), 1)
    assert [type(e) for e in events] == [QueueOverfull]
    assert gateway.is_blocked("/", "q")


def test_removals_below_resume_emit_underfull_and_wake_connections() -> None:
    gateway, events = _gateway()
    connection = FakeConnection(1)
    gateway.register(connection)
    gateway.queue_declared("/", "q", STOP_10)
    for _ in range(11):
        gateway.published("/", frozenset({"q"}), 1)
    gateway.removed("/", "q", 7, 7)
    assert isinstance(events[-1], QueueUnderfull)
    assert connection.refreshes == 1
    assert not gateway.is_blocked("/", "q")


def test_blockers_name_every_stopped_queue_of_the_route_in_order() -> None:
    gateway, _ = _gateway()
    for name in ("b", "a", "c"):
        gateway.queue_declared("/", name, {"qpid.flow_stop_count": 1})
    for name in ("b", "a"):
        gateway.published("/", frozenset({name}), 1)
        gateway.published("/", frozenset({name}), 1)
    assert gateway.blockers("/", frozenset({"a", "b", "c"})) == ["a", "b"]


def test_route_blocker_sees_any_stopped_queue() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 1})
    gateway.published("/", frozenset({"q"}), 1)
    gateway.published("/", frozenset({"q"}), 1)
    blocked = gateway.route_blocker("/")
    assert blocked(frozenset({"other", "q"}))
    assert not blocked(frozenset({"other"}))


def test_vhost_block_names_all_queues() -> None:
    gateway, _ = _gateway()
    gateway.set_vhost_blocked("/", True)
    assert gateway.blockers("/", frozenset({"q"})) == [ALL_QUEUES]
    assert gateway.route_blocker("/")(frozenset({"q"}))


def test_runtime_thresholds_override_arguments() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 100, "flowResumeCount": 50})
    snapshot = gateway.snapshot("/", "q")
    assert (snapshot.thresholds.stop_count, snapshot.source) == (100, "runtime")


def test_runtime_stop_below_old_resume_derives_resume() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 1000, "qpid.flow_resume_count": 900})
    thresholds = gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 80})
    assert (thresholds.stop_count, thresholds.resume_count) == (80, 70)


def test_runtime_threshold_applies_to_current_depth_at_once() -> None:
    gateway, events = _gateway()
    gateway.queue_declared("/", "q", None)
    for _ in range(5):
        gateway.published("/", frozenset({"q"}), 1)
    gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 3, "flowResumeCount": 1})
    assert isinstance(events[-1], QueueOverfull)


def test_bad_runtime_threshold_names_the_admin_key() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", None)
    with pytest.raises(ThresholdError, match="flowResumeCount"):
        gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 5, "flowResumeCount": 9})


def test_unknown_runtime_key_is_refused() -> None:
    gateway, _ = _gateway()
    with pytest.raises(ThresholdError, match="colour"):
        gateway.set_runtime_thresholds("/", "q", {"colour": 1})


def test_deleting_queue_forgets_its_runtime_thresholds() -> None:
    gateway, _ = _gateway()
    forgotten: list[tuple[str, str]] = []
    gateway.runtime_forgotten = forgotten.append
    gateway.queue_declared("/", "q", None)
    gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 3})
    gateway.queue_deleted("/", "q")
    assert forgotten == [("/", "q")]
    assert gateway.runtime_thresholds("/", "q") is None


def test_policy_change_from_snapshot_rethresholds() -> None:
    gateway, _ = _gateway()
    gateway.queue_seen("/", "q", {}, {})
    gateway.queue_seen("/", "q", {}, {"max-length": 100, "overflow": "reject-publish"})
    assert gateway.snapshot("/", "q").thresholds.stop_count == 80


def test_reconcile_adopts_rabbitmq_count_and_runs_machine() -> None:
    gateway, events = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    gateway.reconcile("/", "q", messages=50, size=None, seen_version=0, settle=0.0)
    assert gateway.snapshot("/", "q").messages == 50
    assert isinstance(events[-1], QueueOverfull)


def test_snapshot_json_has_admin_keys() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    assert set(gateway.snapshot("/", "q").to_json()) == {
        "name",
        "vhost",
        "messages",
        "bytes",
        "flowStopCount",
        "flowResumeCount",
        "flowStopSize",
        "flowResumeSize",
        "source",
        "flowStopped",
        "flowStoppedCount",
        "flowStoppedSeconds",
        "blockedChannels",
    }
