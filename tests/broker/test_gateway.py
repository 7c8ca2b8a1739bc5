"""Shared gateway state: depth to events, blocking, runtime thresholds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rabbitflow_broker.engine.flow import ARGUMENT_NAMES, ThresholdError, Thresholds
from rabbitflow_broker.events import ALL_QUEUES, Event, QueueOverfull, QueueUnderfull
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from tests.broker.cluster_link import QuietLink

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STOP_10 = {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}


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


def test_removals_below_resume_emit_underfull_and_report_the_change() -> None:
    gateway, events = _gateway()
    pending: list[None] = []
    gateway.on_change = lambda: pending.append(None)
    gateway.queue_declared("/", "q", STOP_10)
    for _ in range(11):
        gateway.published("/", frozenset({"q"}), 1)
    went_on = gateway.take_changes()
    assert went_on is not None
    assert (went_on.went_on, went_on.went_off, went_on.vhosts) == ({("/", "q")}, set(), set())
    gateway.removed("/", "q", 7, 7)
    assert isinstance(events[-1], QueueUnderfull)
    assert not gateway.is_blocked("/", "q")
    went_off = gateway.take_changes()
    assert went_off is not None
    assert (went_off.went_off, went_off.vhosts) == ({("/", "q")}, {"/"})
    assert went_off.concerns("/")
    assert not went_off.concerns("other")
    assert len(pending) == 2  # once per batch of changes, not per change
    assert gateway.take_changes() is None


def test_admin_stops_report_their_vhost_or_every_vhost() -> None:
    gateway, _ = _gateway()
    gateway.on_change = lambda: None
    gateway.stop_producers(vhost="billing")
    gateway.start_producers(vhost="billing")
    changes = gateway.take_changes()
    assert changes is not None
    assert changes.vhosts == {"billing"}
    gateway.stop_producers(queue="q")
    changes = gateway.take_changes()
    assert changes is not None
    assert changes.concerns("any vhost")


def test_without_a_driver_no_changes_pile_up() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    for _ in range(11):
        gateway.published("/", frozenset({"q"}), 1)
    gateway.removed("/", "q", 11, 11)
    assert gateway.take_changes() is None


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


@pytest.mark.parametrize(
    "value",
    ["100", 1.5, True, None, -1, [100]],
    ids=["str", "float", "bool", "null", "negative", "list"],
)
def test_runtime_threshold_of_the_wrong_type_is_refused_naming_it(value: object) -> None:
    """JSON gives any type: refused with the admin API's name, nothing changed
    (the compiled hub must not fail with a TypeError instead)."""
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", STOP_10)
    with pytest.raises(ThresholdError, match="flowStopCount"):
        gateway.set_runtime_thresholds("/", "q", {"flowStopCount": value})
    assert gateway.snapshot("/", "q").source != "runtime"


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


# -- no setting leaves an empty queue ON ---------------------------------------
#
# Every combination of stop and resume values, each absent, 0 or set, in both
# dimensions, through every source of thresholds: the queue is filled past
# whatever stop value it ended up with, then emptied, and must be OFF.

_ABSENT = None
_COUNT_VALUES = (_ABSENT, 0, 10)  # stop candidates; resume candidates below
_RESUME_COUNT_VALUES = (_ABSENT, 0, 5)
_SIZE_VALUES = (_ABSENT, 0, 1000)
_RESUME_SIZE_VALUES = (_ABSENT, 0, 500)
_COMBINATIONS = [
    (stop_count, resume_count, stop_size, resume_size)
    for stop_count in _COUNT_VALUES
    for resume_count in _RESUME_COUNT_VALUES
    for stop_size in _SIZE_VALUES
    for resume_size in _RESUME_SIZE_VALUES
]


def _given(values: tuple[int | None, ...], names: tuple[str, ...]) -> dict[str, object]:
    return {name: value for name, value in zip(names, values, strict=True) if value is not None}


def _resume_above_stop(values: tuple[int | None, ...]) -> bool:
    stop_count, resume_count, stop_size, resume_size = (v or 0 for v in values)
    return resume_count > stop_count or resume_size > stop_size


def _fill_past_stop_then_empty(gateway: Gateway, queue: str) -> tuple[bool, bool]:
    """Fill past the queue's stop values, then remove everything.

    Returns (stopped when full, stopped when empty).
    """
    thresholds = gateway.flow(("/", queue)).thresholds
    messages = thresholds.stop_count + 1
    size = thresholds.stop_size // messages + 1
    for _ in range(messages):
        gateway.published("/", frozenset({queue}), size)
    full = gateway.is_blocked("/", queue)
    gateway.removed("/", queue, messages, messages * size)
    assert gateway.depth.get(("/", queue)).messages == 0
    return full, gateway.is_blocked("/", queue)


@pytest.mark.parametrize("values", _COMBINATIONS)
def test_declared_thresholds_never_leave_an_empty_queue_on(
    values: tuple[int | None, ...],
) -> None:
    gateway, _ = _gateway(default_queue_limit=0)
    arguments = _given(values, ARGUMENT_NAMES)
    if _resume_above_stop(values):
        # Refused outright; nothing is declared.
        with pytest.raises(ThresholdError, match="above the stop value"):
            gateway.validate_declare(arguments)
        return
    gateway.validate_declare(arguments)
    gateway.queue_declared("/", "q", arguments)
    thresholds = gateway.flow(("/", "q")).thresholds
    full, empty = _fill_past_stop_then_empty(gateway, "q")
    assert full is thresholds.enabled
    assert empty is False


@pytest.mark.parametrize("values", _COMBINATIONS)
def test_runtime_thresholds_never_leave_an_empty_queue_on(
    values: tuple[int | None, ...],
) -> None:
    gateway, _ = _gateway()
    # Start from defaults in both dimensions, so a value left out keeps one.
    maxima = {"x-max-length": 100, "x-max-length-bytes": 10_000, "x-overflow": "reject-publish"}
    gateway.queue_declared("/", "q", maxima)
    changes = _given(values, ("flowStopCount", "flowResumeCount", "flowStopSize", "flowResumeSize"))
    stop_count, resume_count, stop_size, resume_size = values
    # A stop value left out keeps the default one (80 messages, 8,000 bytes).
    kept = (80 if stop_count is None else stop_count, resume_count)
    kept += (8000 if stop_size is None else stop_size, resume_size)
    if _resume_above_stop(kept):
        with pytest.raises(ThresholdError, match="above the stop value"):
            gateway.set_runtime_thresholds("/", "q", changes)
        return
    if changes:
        gateway.set_runtime_thresholds("/", "q", changes)
    thresholds = gateway.flow(("/", "q")).thresholds
    full, empty = _fill_past_stop_then_empty(gateway, "q")
    assert full is thresholds.enabled
    assert empty is False


_STORED = [v for v in _COMBINATIONS if None not in v]


def _ids(values: tuple[int | None, ...]) -> str:
    return "-".join(map(str, values))


@pytest.mark.parametrize("values", [v for v in _STORED if not _resume_above_stop(v)], ids=_ids)
def test_stored_thresholds_never_leave_an_empty_queue_on(values: tuple[int, ...]) -> None:
    stop_count, resume_count, stop_size, resume_size = values
    gateway, _ = _gateway(default_queue_limit=0)
    gateway.load_runtime_thresholds(
        {
            ("/", "q"): Thresholds(
                stop_count=stop_count,
                resume_count=resume_count,
                stop_size=stop_size,
                resume_size=resume_size,
            )
        }
    )
    gateway.queue_declared("/", "q", None)
    full, empty = _fill_past_stop_then_empty(gateway, "q")
    assert full is bool(stop_count or stop_size)
    assert empty is False


@pytest.mark.parametrize("values", [v for v in _STORED if _resume_above_stop(v)], ids=_ids)
def test_thresholds_with_a_resume_above_its_stop_cannot_be_stored(
    values: tuple[int, ...],
) -> None:
    stop_count, resume_count, stop_size, resume_size = values
    with pytest.raises(ThresholdError, match="above the stop value"):
        Thresholds(
            stop_count=stop_count,
            resume_count=resume_count,
            stop_size=stop_size,
            resume_size=resume_size,
        )


_MAXIMA = [
    {},
    {"x-max-length": 1},
    {"x-max-length": 10},
    {"x-max-length-bytes": 1000},
    {"x-max-length": 10, "x-max-length-bytes": 1000},
    {"qpid.max_count": 10},
    {"qpid.max_size": 1000},
]


@pytest.mark.parametrize("maximum", _MAXIMA, ids=lambda m: ",".join(m) or "default-limit")
@pytest.mark.parametrize(("stop_pct", "resume_pct"), [(80, 70), (80, 0), (1, 1), (0, 0)])
def test_default_thresholds_never_leave_an_empty_queue_on(
    maximum: dict[str, int], stop_pct: int, resume_pct: int
) -> None:
    gateway, _ = _gateway(
        default_queue_limit=1000,
        default_flow_stop_threshold=stop_pct,
        default_flow_resume_threshold=resume_pct,
    )
    gateway.queue_declared("/", "q", {**maximum, "x-overflow": "reject-publish"})
    thresholds = gateway.flow(("/", "q")).thresholds
    full, empty = _fill_past_stop_then_empty(gateway, "q")
    assert full is thresholds.enabled
    assert empty is False


def test_default_resume_percentage_zero_derives_resume_from_stop() -> None:
    gateway, _ = _gateway(default_flow_stop_threshold=80, default_flow_resume_threshold=0)
    gateway.queue_declared("/", "q", {"x-max-length": 1000, "x-overflow": "reject-publish"})
    thresholds = gateway.flow(("/", "q")).thresholds
    assert (thresholds.stop_count, thresholds.resume_count) == (800, 700)


def test_runtime_resume_zero_is_derived_from_the_stop_value() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", None)
    thresholds = gateway.set_runtime_thresholds(
        "/", "q", {"flowStopCount": 80, "flowResumeCount": 0}
    )
    assert (thresholds.stop_count, thresholds.resume_count) == (80, 70)


def test_runtime_stop_on_a_queue_without_count_thresholds_gets_a_resume() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "q", None)  # default size thresholds only
    thresholds = gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 5})
    assert thresholds.resume_count == 4


class _RecordingLink(QuietLink):
    """A quiet cluster link that keeps the thresholds the hub shares."""

    def __init__(self) -> None:
        super().__init__(owner=True)
        self.shared: list[Thresholds] = []

    def thresholds_changed(self, key: tuple[str, str], thresholds: Thresholds) -> None:
        self.shared.append(thresholds)


def test_runtime_thresholds_reach_the_cluster_with_an_unset_resume_left_unset() -> None:
    """Each member derives the resume itself, so a later stop alone re-derives it there."""
    gateway, _ = _gateway()
    link = _RecordingLink()
    gateway.join_cluster(link)
    gateway.queue_declared("/", "q", None)  # default size thresholds only
    in_force = gateway.set_runtime_thresholds("/", "q", {"flowStopCount": 1000})
    shared = link.shared[0]
    assert (in_force.resume_count, in_force.resume_size > 0) == (875, True)
    assert (shared.stop_count, shared.resume_count, shared.resume_size) == (1000, 0, 0)


def test_a_member_given_a_stop_alone_derives_its_resume_and_rederives_it_for_a_new_stop() -> None:
    member, _ = _gateway()
    member.queue_declared("/", "q", None)
    member.load_runtime_thresholds({("/", "q"): Thresholds(stop_count=1000)})
    derived = member.flow(("/", "q")).thresholds.resume_count
    raised = member.set_runtime_thresholds("/", "q", {"flowStopCount": 2000})
    assert (derived, raised.resume_count) == (875, 1750)


def test_runtime_thresholds_on_a_stream_are_refused() -> None:
    gateway, _ = _gateway()
    gateway.queue_declared("/", "s", {"x-queue-type": "stream"})
    with pytest.raises(ThresholdError, match=r"flowStopCount: .*stream"):
        gateway.set_runtime_thresholds("/", "s", {"flowStopCount": 5})


def test_stream_declare_with_flow_argument_is_refused_naming_it() -> None:
    gateway, _ = _gateway()
    with pytest.raises(ThresholdError) as caught:
        gateway.validate_declare({"x-queue-type": "stream", "qpid.flow_stop_size": 10})
    assert caught.value.argument == "qpid.flow_stop_size"


def test_stream_gets_no_default_thresholds() -> None:
    gateway, _ = _gateway(default_queue_limit=10_000)
    gateway.queue_declared("/", "s", {"x-queue-type": "stream"})
    assert gateway.snapshot("/", "s").source == "none"
