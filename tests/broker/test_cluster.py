"""The owner's and a member's allowance rules, one at a time (pure)."""

from __future__ import annotations

from rabbitflow_broker.engine.cluster import (
    Flow,
    FlowUpdate,
    MemberAllowance,
    QueueOwner,
    Report,
    Request,
)

Q = "orders"


def _owner(**kwargs: object) -> QueueOwner:
    """An owner past its first lease (unless ``started_at`` says otherwise)."""
    kwargs.setdefault("started_at", -2.0)
    return QueueOwner(Q, stop=100, resume=50, batch=10, lease=2.0, **kwargs)  # type: ignore[arg-type]


def test_a_grant_is_not_usable_past_its_lease_counted_from_the_request() -> None:
    owner, member = _owner(), MemberAllowance("m1", Q, batch=10, lease=2.0)
    request = member.wants(now=0.0)
    assert request is not None
    grant, _ = owner.request(request, now=1.5)  # answered late
    assert grant is not None
    member.granted(grant)
    assert member.take(now=1.9)
    assert not member.take(now=2.0)  # 2 s after asking, whatever the owner's clock
    assert member.available(now=2.0) == 0


def test_the_owner_tops_a_member_up_to_one_batch() -> None:
    owner = _owner()
    first, _ = owner.request(Request("m1", Q, 0.0), now=0.0)
    assert first is not None
    assert first.amount == 10
    # 4 used and reported with the next request: 6 still held, 4 granted.
    second, _ = owner.request(
        Request("m1", Q, 0.1, (Report("m1", Q, first.grant_id, 4, 0),)), now=0.1
    )
    assert second is not None
    assert second.amount == 4
    assert owner.outstanding == 10
    assert owner.depth == 4
    none, _ = owner.request(Request("m1", Q, 0.2), now=0.2)
    assert none is None


def test_nothing_is_granted_while_the_queue_is_on() -> None:
    owner = _owner()
    owner.observe_depth(101, owner.version, now=10.0)
    assert owner.flow is Flow.ON
    grant, _ = owner.request(Request("m1", Q, 10.0), now=10.0)
    assert grant is None


def test_a_new_owner_grants_nothing_for_one_lease() -> None:
    owner = _owner(epoch=2, started_at=100.0)
    assert owner.request(Request("m1", Q, 100.0), now=101.9)[0] is None
    grant, _ = owner.request(Request("m1", Q, 102.0), now=102.0)
    assert grant is not None
    assert grant.epoch == 2


def test_an_expired_unreported_grant_counts_as_used() -> None:
    owner = _owner()
    owner.request(Request("m1", Q, 0.0), now=0.0)
    owner.expire(now=2.0)
    assert owner.outstanding == 0
    assert owner.depth == 10  # its messages may all be queued


def test_rabbitmqs_count_is_adopted_only_after_a_quiet_settle() -> None:
    owner = _owner()
    owner.report(Report("m1", Q, 0, 0, 0), now=5.0)
    assert owner.observe_depth(200, owner.version, now=5.1) is None
    assert owner.depth == 0
    stale = owner.version
    owner.report(Report("m1", Q, 0, 0, 0), now=5.2)
    assert owner.observe_depth(200, stale, now=6.0) is None  # a report raced it
    update = owner.observe_depth(200, owner.version, now=6.0)
    assert update == FlowUpdate(Q, Flow.ON, 1)


def test_a_member_ignores_flow_updates_of_an_older_owner() -> None:
    member = MemberAllowance("m1", Q)
    member.flow_update(FlowUpdate(Q, Flow.ON, 3))
    member.flow_update(FlowUpdate(Q, Flow.OFF, 2))
    assert member.flow is Flow.ON
    assert not member.take(now=0.0)


def test_an_on_queue_holds_completions_even_with_allowance_left() -> None:
    owner, member = _owner(), MemberAllowance("m1", Q, batch=10)
    grant, _ = owner.request(Request("m1", Q, 0.0), now=0.0)
    assert grant is not None
    member.granted(grant)
    member.flow_update(FlowUpdate(Q, Flow.ON, 1))
    assert member.available(now=0.1) == 10
    assert not member.take(now=0.1)
