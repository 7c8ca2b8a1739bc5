"""The runtime thresholds a cluster shares: which change wins, and when
they go with their queue (only when it is gone for sure, and then on every
member).

Each node's wall clock (its changes' stamps) moves with the test's
:class:`~tests.broker.test_cluster_node.Clock`.
"""

from __future__ import annotations

from typing import Any

from rabbitflow_broker.engine.cluster_settings import SharedStops, SharedThresholds
from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.cluster_node import ClusterNode
from tests.broker.test_cluster_node import KEY, Clock, _last, _owned, _sending, deleted_through

_ARGUMENTS = {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}


def _stop(node_gateway: object) -> int:
    return node_gateway.flow(KEY).thresholds.stop_count  # type: ignore[attr-defined, no-any-return]


def _owner_stopping_at_40() -> tuple[Clock, ClusterNode, Gateway, list[dict[str, Any]]]:
    """A clock, and the owner "a" (:func:`_owned`) with runtime thresholds
    for KEY set on it: stop count 40."""
    clock, owner, gateway, sent = _owned()
    gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 40})
    return clock, owner, gateway, sent


# -- which change wins ----------------------------------------------------------------


def test_a_stamp_follows_the_wall_clock_and_is_above_every_stamp_seen() -> None:
    thresholds = SharedThresholds("a")
    thresholds.set(KEY, Thresholds(stop_count=40), 5_000)
    assert thresholds.stamps[KEY][0] == 5_000
    thresholds.set(KEY, Thresholds(stop_count=41), 4_000)  # the wall clock stepped back
    assert thresholds.stamps[KEY][0] == 5_001
    thresholds.merge([["/", "other", 9_000, "b", [7, 0, 0, 0]]])
    thresholds.set(KEY, Thresholds(stop_count=42), 6_000)
    assert thresholds.stamps[KEY][0] == 9_001
    stops = SharedStops("a")
    stops.note([(None, None)], 7_000)
    assert stops.stamps[(None, None)][:2] == (7_000, "a")


def test_a_change_on_a_member_that_merged_no_state_yet_wins_over_older_changes() -> None:
    clock, owner, owner_gateway, owner_sent = _owned()
    for stop in (40, 41, 42):  # three changes on the owner
        owner_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": stop})
    clock.now += 5.0
    fresh, fresh_gateway, fresh_sent = _sending("z", clock)  # started later: no state heard yet
    fresh_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 99})  # the admin API: 200 OK
    owner._dispatch([m for m in fresh_sent if m["t"] == "thr"][-1], False)
    assert _stop(owner_gateway) == 99
    fresh._dispatch(_last(owner_sent, "state", owner), False)
    assert _stop(fresh_gateway) == 99  # the later change holds where it was made too


def test_a_change_from_a_member_without_stamps_holds_on_every_member() -> None:
    # A member not upgraded yet sends its change without a stamp: the owner
    # stamps it as a change of its own, so its next state does not undo it.
    clock, owner, owner_gateway, owner_sent = _owner_stopping_at_40()
    member, member_gateway, _ = _sending("b", clock)
    member._dispatch(_last(owner_sent, "state", owner), False)
    clock.now += 1.0
    old = {"t": "thr", "m": "old", "v": KEY[0], "q": KEY[1], "th": [70, 0, 0, 0]}
    owner._dispatch(old, False)
    member._dispatch(old, False)
    clock.now += 1.0
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert _stop(owner_gateway) == 70
    assert _stop(member_gateway) == 70
    later, later_gateway, _ = _sending("c", clock)
    later._dispatch(_last(owner_sent, "state", owner), False)
    assert _stop(later_gateway) == 70


# -- runtime thresholds go with their queue, only when it is gone ----------------------


def test_a_queue_one_snapshot_missed_keeps_its_runtime_thresholds_on_every_member() -> None:
    clock, owner, owner_gateway, owner_sent = _owner_stopping_at_40()
    member, member_gateway, member_sent = _sending("b", clock)
    member._dispatch(_last(owner_sent, "state", owner), False)
    # b's reconciliation: a stopping node's snapshot misses the queue, the next lists it
    member_gateway.queue_deleted(*KEY)
    member_gateway.queue_seen(*KEY, _ARGUMENTS, None)
    for _ in range(5):
        clock.now += 1.0
        member._dispatch(_last(owner_sent, "state", owner), False)
    assert not [m for m in member_sent if m["t"] == "thr"]  # nothing said gone
    later, later_gateway, _ = _sending("c", clock)
    later._dispatch(_last(owner_sent, "state", owner), False)
    assert _stop(owner_gateway) == _stop(member_gateway) == _stop(later_gateway) == 40


def test_runtime_thresholds_of_a_queue_gone_for_three_snapshots_go_on_every_member() -> None:
    clock, owner, owner_gateway, owner_sent = _owner_stopping_at_40()
    member, member_gateway, member_sent = _sending("b", clock)
    member._dispatch(_last(owner_sent, "state", owner), False)
    member_gateway.queue_deleted(*KEY)  # deleted at RabbitMQ: its snapshots miss it from now on
    for _ in range(2):
        clock.now += 1.0
        member._dispatch(_last(owner_sent, "state", owner), False)
    assert not [m for m in member_sent if m["t"] == "thr"]  # not yet: 2 s only
    for _ in range(2):
        clock.now += 1.0
        member._dispatch(_last(owner_sent, "state", owner), False)
    gone = [m for m in member_sent if m["t"] == "thr"]
    assert gone
    assert gone[-1]["th"] is None
    owner._dispatch(gone[-1], False)
    assert owner_gateway.runtime_thresholds(*KEY) is None  # the owner's hub forgets them too
    assert _stop(owner_gateway) == 10  # its declare arguments again


def test_a_queue_deleted_through_one_member_takes_its_thresholds_from_every_member() -> None:
    clock, owner, owner_gateway, owner_sent = _owner_stopping_at_40()
    members = [_sending(member, clock) for member in ("b", "c")]
    for node, _, _ in members:
        node._dispatch(_last(owner_sent, "state", owner), False)
    (_, deleter_gateway, deleter_sent), (other, other_gateway, _) = members
    deleted_through(deleter_gateway, KEY)
    gone = [m for m in deleter_sent if m["t"] == "thr"]
    assert gone  # said at once
    assert gone[-1]["th"] is None
    owner._dispatch(gone[-1], False)
    clock.now += 1.0
    other._dispatch(_last(owner_sent, "state", owner), False)
    assert owner_gateway.runtime_thresholds(*KEY) is None
    assert other_gateway.runtime_thresholds(*KEY) is None
    assert _stop(owner_gateway) == _stop(other_gateway) == 10


def test_a_member_without_its_first_snapshot_says_no_runtime_thresholds_are_gone() -> None:
    clock, owner, _, owner_sent = _owner_stopping_at_40()
    member, member_gateway, member_sent = _sending("b", clock)
    member_gateway.queue_deleted(*KEY)  # as if it never listed the queue
    member_gateway.ready_error = "gateway starting: waiting for the first routing snapshot"
    for _ in range(10):
        clock.now += 1.0
        member._dispatch(_last(owner_sent, "state", owner), False)
    assert not [m for m in member_sent if m["t"] == "thr"]
