"""What a cluster member's admin API shows of a queue whose accounting
another member owns: the owner's flow state, depth and flowStoppedCount."""

from __future__ import annotations

import datetime as dt

from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from tests.broker.cluster_link import QuietLink

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KEY = ("/", "orders")


def _member_gateway() -> tuple[Gateway, QuietLink]:
    gateway = Gateway(GatewayConfig(), sink=lambda event: None, clock=lambda: NOW)
    gateway.routing.declare_queue(*KEY, {})
    gateway.queue_declared(*KEY, {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5})
    member = QuietLink()
    gateway.join_cluster(member)
    return gateway, member


def _shown(gateway: Gateway) -> tuple[int, int, bool, int]:
    snap = gateway.snapshot(*KEY)
    return snap.messages, snap.bytes, snap.flow_stopped, snap.flow_stopped_count


def test_a_member_shows_its_own_count_until_the_owner_publishes_one() -> None:
    gateway, _ = _member_gateway()
    gateway.published("/", frozenset({"orders"}), 100)
    assert _shown(gateway) == (1, 100, False, 0)
    gateway.set_cluster_flow({KEY})
    gateway.shared_depths({KEY: (42, 4200, 3)})
    assert _shown(gateway) == (42, 4200, True, 3)
    assert [q.to_json()["messages"] for q in gateway.snapshots()] == [42]


def test_the_owners_flow_state_is_shown_whatever_the_members_own_depth() -> None:
    gateway, _ = _member_gateway()
    for _ in range(12):  # over stop here: the owner decides, not this member
        gateway.published("/", frozenset({"orders"}), 1)
    assert _shown(gateway)[2] is False
    gateway.set_cluster_flow({KEY})
    gateway.remote_depth(KEY, -12, -12)  # its own count falls under resume
    assert _shown(gateway)[2] is True
    gateway.set_cluster_flow(set())
    assert _shown(gateway)[2] is False


def test_a_new_owner_counts_on_from_its_predecessors_broadcast() -> None:
    # The predecessor counted every member's traffic: 42 messages, past the
    # stop threshold.  The new owner counts on from there (its own publish
    # makes 43), so the queue stays flowed; its flowStoppedCount is its own.
    gateway, member = _member_gateway()
    gateway.shared_depths({KEY: (42, 4200, 3)})
    member.owner = True
    gateway.take_ownership()
    gateway.published("/", frozenset({"orders"}), 100)
    assert _shown(gateway) == (43, 4300, True, 1)
    assert gateway.depth_view(KEY) == (43, 4300, 1)
    assert gateway.depth_view(("/", "unknown")) == (0, 0, 0)


def test_a_deleted_queue_forgets_the_owners_count() -> None:
    gateway, _ = _member_gateway()
    gateway.shared_depths({KEY: (42, 4200, 3)})
    gateway.queue_deleted(*KEY)
    gateway.queue_declared(*KEY, {"qpid.flow_stop_count": 10})
    assert _shown(gateway)[:2] == (0, 0)


def test_removals_through_a_member_are_reported_to_the_owner() -> None:
    gateway, member = _member_gateway()
    gateway.removed("/", "orders", 2, 30)
    gateway.removed("/", "orders", 1, 5)
    (request,) = member.book.requests(1.0)  # a removal report, due at once
    assert [(r.removed, r.removed_bytes) for r in request.reports] == [(3, 35)]


def test_with_the_owner_out_of_reach_a_member_shows_its_own_count() -> None:
    gateway, _ = _member_gateway()
    gateway.published("/", frozenset({"orders"}), 100)
    gateway.shared_depths({KEY: (42, 4200, 3)})
    gateway.shared_depths(None)
    assert _shown(gateway)[:2] == (1, 100)
