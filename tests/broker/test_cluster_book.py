"""A member's allowances and the owner's ledgers (pure: no bus, no clock)."""

from __future__ import annotations

from rabbitflow_broker.engine.cluster import (
    MAX_RAMP_BATCHES,
    Flow,
    FlowUpdate,
    Grant,
    Report,
    Request,
)
from rabbitflow_broker.engine.cluster_book import (
    DUE,
    FLOW_AFTER_S,
    FREE_FOR_S,
    HELD,
    REPORT_EVERY_S,
    MemberBook,
    Missing,
    OwnerBook,
)
from rabbitflow_broker.engine.depth import QueueDepth

KEY = ("/", "orders")
NAME = "/\x00orders"


def _book() -> MemberBook:
    return MemberBook("m1", batch=10, lease=2.0)


def _grant(request: Request, amount: int = 10, grant_id: int = (2 << 32) + 1) -> Grant:
    return Grant("m1", NAME, grant_id, amount, request.asked_at, 2)


def test_without_allowance_a_publish_is_held_then_paid_by_the_grant() -> None:
    book = _book()
    assert book.publish(KEY, 100, now=0.0) is False
    assert book.publish(KEY, 100, now=0.0) is False
    assert KEY in book.held
    (request,) = book.requests(now=0.0)
    assert request.queue == NAME
    assert book.granted(KEY, _grant(request), now=0.01) is True  # debt of 2 paid
    assert KEY not in book.held
    assert book.publish(KEY, 100, now=0.02) is True
    # 2 paid + 1 taken: reported with the next request (at half a batch).
    for _ in range(2):
        assert book.publish(KEY, 100, now=0.03)
    (ask,) = book.requests(now=0.04)
    assert sum(r.used for r in ask.reports) == 5
    assert sum(r.used_bytes for r in ask.reports) == 500


def test_a_grant_smaller_than_the_debt_keeps_the_queue_held() -> None:
    book = _book()
    for _ in range(5):
        book.publish(KEY, 0, now=0.0)
    (request,) = book.requests(now=0.0)
    assert book.granted(KEY, _grant(request, amount=3), now=0.01) is False
    assert KEY in book.held


def test_a_long_hold_flows_the_channels() -> None:
    book = _book()
    book.publish(KEY, 0, now=0.0)
    assert book.tick(now=FLOW_AFTER_S / 2) == set()
    assert book.tick(now=FLOW_AFTER_S) == {KEY}
    assert KEY in book.flowed


def test_while_the_owner_says_on_nothing_completes_even_with_allowance() -> None:
    book = _book()
    book.publish(KEY, 0, now=0.0)
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request), now=0.0)
    book.flow(KEY, FlowUpdate(NAME, Flow.ON, 2), now=0.0)
    for _ in range(10):  # one more than the 9 left
        assert book.publish(KEY, 0, now=0.1) is False
    assert book.requests(now=1.0) == []  # nothing is asked while ON
    book.flow(KEY, FlowUpdate(NAME, Flow.OFF, 2), now=0.0)  # 9 paid, 1 short
    assert KEY in book.held
    (ask,) = book.requests(now=1.0)  # asked at once when OFF again
    assert ask.asked_at == 1.0


def test_an_expired_grant_is_not_used() -> None:
    book = _book()
    book.publish(KEY, 0, now=0.0)
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request), now=0.0)
    assert book.publish(KEY, 0, now=1.9) is True
    assert book.publish(KEY, 0, now=2.0) is False  # the lease ran out


def test_a_queue_without_thresholds_needs_no_allowance_for_a_while() -> None:
    book = _book()
    book.publish(KEY, 0, now=0.0)
    assert book.free(KEY, now=0.01) is True
    assert book.publish(KEY, 0, now=1.0) is True
    assert KEY not in book.held
    # Still in use late in the window: the answer is renewed before it lapses.
    book.publish(KEY, 0, now=FREE_FOR_S - 1)
    (renew,) = book.requests(now=FREE_FOR_S - 1)
    assert renew.asked_at == FREE_FOR_S - 1
    book.governed(KEY)  # thresholds set meanwhile: ask before the next completion
    assert book.publish(KEY, 0, now=FREE_FOR_S - 0.5) is False


def test_removals_are_reported_without_publishing() -> None:
    book = _book()
    book.removed(KEY, 3, 30)
    (report,) = book.requests(now=1.0)
    assert report.asked_at != report.asked_at  # NaN: reports only, no allowance asked
    assert [(r.removed, r.removed_bytes) for r in report.reports] == [(3, 30)]


def test_an_older_epoch_grant_is_refused() -> None:
    book = _book()
    book.flow(KEY, FlowUpdate(NAME, Flow.OFF, 3), now=0.0)
    book.publish(KEY, 0, now=0.0)
    (request,) = book.requests(now=0.0)
    assert book.granted(KEY, _grant(request), now=0.0) is False  # epoch 2 < 3
    assert KEY in book.held


def test_the_owner_tops_up_to_one_batch_and_waits_a_lease_first() -> None:
    owner = OwnerBook("o", batch=10, lease=2.0, epoch=3, started_at=100.0)
    request = Request("m1", NAME, 100.0)
    assert owner.grant(KEY, request, 101.0, on=False) is None  # its first lease
    grant = owner.grant(KEY, Request("m1", NAME, 102.0), 102.0, on=False)
    assert grant is not None
    assert grant.amount == 10
    assert grant.grant_id >> 32 == 3  # ids carry the epoch: no two owners share one
    assert owner.grant(KEY, Request("m1", NAME, 102.1), 102.1, on=False) is None
    assert owner.grant(KEY, Request("m2", NAME, 102.1), 102.1, on=True) is None
    assert owner.outstanding(KEY) == 10
    assert owner.expire(104.0) == {KEY: 10}  # unreported: counted as enqueued


def test_far_below_the_stop_threshold_grants_share_the_room() -> None:
    owner = OwnerBook("o", batch=10, lease=2.0, epoch=3, started_at=0.0)
    kwargs = {"on": False, "stop": 1000, "sharers": 2}
    first = owner.grant(KEY, Request("m1", NAME, 5.0), 5.0, depth=100, **kwargs)
    assert first is not None
    assert first.amount == 160  # MAX_GRANT_BATCHES batches, well within (1000 - 100) / 2
    # Near the threshold the room is small: a batch at most, topped up.
    near = owner.grant(KEY, Request("m2", NAME, 5.0), 5.0, depth=820, **kwargs)
    assert near is not None
    assert near.amount == 10
    # depth + everything outstanding stays within stop + M x B.
    assert 820 + owner.outstanding(KEY) <= 1000 + 2 * 10


def test_a_member_that_asks_again_soon_gets_a_doubled_grant_within_the_room() -> None:
    owner = OwnerBook("o", batch=10, lease=2.0, epoch=3, started_at=0.0)
    kwargs = {"on": False, "stop": 100_000, "sharers": 2}

    def ask(member: str, at: float, depth: int = 0) -> int:
        grant = owner.grant(KEY, Request(member, NAME, at), at, depth=depth, **kwargs)
        assert grant is not None
        owner.settle(KEY, Report(member, NAME, grant.grant_id, grant.amount, 0, returned=True))
        return grant.amount

    assert ask("m1", 5.0) == 160  # MAX_GRANT_BATCHES batches
    assert ask("m1", 5.1) == 320  # used within RAMP_LEASES: twice as much
    assert ask("m1", 5.2) == 640
    assert ask("m1", 5.6) == 640  # neither soon nor late: kept
    assert ask("m1", 6.7) == 160  # after CALM_LEASES: back to the base
    assert ask("m2", 6.7) == 160  # each member its own pace
    for at in (6.72, 6.74, 6.76, 6.78, 6.8, 6.82, 6.84):
        ask("m2", at)
    assert ask("m2", 6.86) == MAX_RAMP_BATCHES * 10
    # The room still caps it: (stop - depth - outstanding) / sharers.
    assert ask("m2", 6.88, depth=99_000) == 500


def test_a_member_asks_again_when_half_its_last_grant_is_used() -> None:
    book = _book()
    book.publish(KEY, 0, now=0.0)
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request, amount=100), now=0.0)  # 1 paid, 99 left
    for _ in range(48):
        book.publish(KEY, 0, now=0.1)
    assert book.due is False
    book.publish(KEY, 0, now=0.1)  # the 50th use since the ask
    assert book.due is True
    (again,) = book.requests(now=0.1)
    assert again.asked_at == 0.1


def test_a_book_needs_rounds_while_allowance_is_in_use_and_not_after() -> None:
    book = _book()
    assert not book.busy(now=0.0)
    book.publish(KEY, 100, now=0.0)  # held: asks at the next round
    assert book.busy(now=0.0)
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request), now=0.01)
    assert book.busy(now=1.0)  # the grant is open and its use unreported
    assert book.busy(now=2.5)  # expired, its use still to report
    book.requests(now=2.5)
    assert not book.busy(now=2.5)  # reported, and the last publish a lease ago
    book.removed(KEY, 1, 100)
    assert book.busy(now=2.5)  # a removal to report
    assert book.requests(now=2.6) == []  # reports wait REPORT_EVERY_S
    assert book.busy(now=2.6)
    book.requests(now=2.5 + REPORT_EVERY_S)
    assert not book.busy(now=3.0)


def test_an_owner_needs_rounds_while_a_grant_is_outstanding() -> None:
    owner = OwnerBook("m1", batch=10, lease=2.0, epoch=1, started_at=-2.0)
    assert not owner.busy()
    grant = owner.grant(KEY, Request("m2", NAME, 0.0, ()), 0.0, on=False)
    assert grant is not None
    assert owner.busy()
    assert owner.expire(now=2.5) == {KEY: grant.amount}
    assert not owner.busy()


def test_a_member_asks_when_half_the_last_grant_is_left_even_with_an_older_grant_open() -> None:
    """The ask comes when the allowance left falls to half the last grant,
    whatever was used since the last ask (a grant still open adds to it)."""
    book = _book()  # batch 10
    book.publish(KEY, 0, now=0.0)  # held: asks
    (first,) = book.requests(now=0.0)
    book.granted(KEY, _grant(first), now=0.0)  # 10: the debt of 1 paid, 9 left
    flags = [book.spend(KEY, 0, 0.01) for _ in range(4)]
    assert flags[-1] & DUE  # 5 left: half the grant
    (second,) = book.requests(now=0.01)
    book.granted(KEY, _grant(second, grant_id=(2 << 32) + 2), now=0.02)  # 15 left
    flags = [book.spend(KEY, 0, 0.03) for _ in range(10)]
    assert [bool(f & DUE) for f in flags] == [False] * 9 + [True]  # at 5 left
    assert book.requests(now=0.03)  # and the allowance asks then


# -- publishes prepaid in the hub's depth entry ------------------------------------


def _spend_like_the_hub(book: MemberBook, depth: QueueDepth, size: int, now: float) -> int:
    """What the hub does per publish: spend what is prepaid, else ask the book."""
    if depth.prepaid and now < depth.prepaid_until:
        depth.prepaid -= 1
        depth.prepaid_bytes += size
        return 0
    return book.spend(KEY, size, now, depth)


def _granted_book(amount: int) -> MemberBook:
    book = _book()  # batch 10, lease 2 s
    book.publish(KEY, 0, now=0.0)  # held: asks
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request, amount=amount), now=0.0)  # the debt of 1 paid
    return book


def test_prepaid_publishes_are_reported_as_used_and_the_rest_goes_back() -> None:
    book = _granted_book(100)  # 99 left: the ask comes at 50 left
    depth = QueueDepth()
    assert _spend_like_the_hub(book, depth, 10, now=0.1) == 0  # 98 left
    assert depth.prepaid == 98 - 50 - 1  # up to one short of the ask point
    assert depth.prepaid_until == 2.0  # the grant's lease
    for _ in range(20):
        assert _spend_like_the_hub(book, depth, 10, now=0.2) == 0
    assert depth.prepaid == 27
    (request,) = book.requests(now=0.25)  # a round settles it first
    assert depth.prepaid == 0  # taken back
    assert sum(r.used for r in request.reports) == 1 + 1 + 20
    assert sum(r.used_bytes for r in request.reports) == 210
    assert book.describe(now=0.25)[0]["allowance"] == 100 - 22


def test_the_ask_still_comes_when_half_the_grant_is_left() -> None:
    book = _granted_book(100)
    depth = QueueDepth()
    flags = [_spend_like_the_hub(book, depth, 0, now=0.1) for _ in range(48)]
    assert not any(f & DUE for f in flags)
    # The 50th use of the grant (the held publish it paid was the first): 50 left.
    assert _spend_like_the_hub(book, depth, 0, now=0.1) & DUE
    assert depth.prepaid == 0


def test_prepaid_publishes_stop_with_the_grant_and_when_the_queue_goes_on() -> None:
    book = _granted_book(100)
    depth = QueueDepth()
    _spend_like_the_hub(book, depth, 0, now=0.1)
    assert depth.prepaid > 0
    # Past the grant's lease nothing prepaid is spent: the book says held.
    assert _spend_like_the_hub(book, depth, 0, now=2.0) & HELD
    book = _granted_book(100)
    depth = QueueDepth()
    _spend_like_the_hub(book, depth, 0, now=0.1)
    book.flow(KEY, FlowUpdate(NAME, Flow.ON, 2), now=0.2)
    assert depth.prepaid == 0
    assert _spend_like_the_hub(book, depth, 0, now=0.2) & HELD
    assert KEY in book.held


def test_a_queue_without_thresholds_is_prepaid_until_that_answer_lapses() -> None:
    book = _book()
    book.free(KEY, now=0.0)
    depth = QueueDepth()
    assert _spend_like_the_hub(book, depth, 0, now=0.1) == 0
    assert depth.prepaid_until == FREE_FOR_S
    book.governed(KEY)  # thresholds were set: the next publish asks
    assert depth.prepaid == 0
    assert _spend_like_the_hub(book, depth, 0, now=0.2) & HELD


def test_top_ups_stop_while_another_members_large_grant_may_be_in_use() -> None:
    # m1 takes a large grant out of the room and uses it without reporting
    # yet; m2's top-ups go on only while depth + everything outstanding stays
    # within stop + M x B, though the depth the owner has seen is below stop.
    stop, batch, members = 300, 20, 2
    owner = OwnerBook("o", batch=batch, lease=2.0, epoch=1, started_at=-2.0)
    kwargs = {"stop": stop, "sharers": members}
    big = owner.grant(KEY, Request("m1", NAME, 0.0), 0.0, on=False, depth=0, **kwargs)
    assert big is not None
    assert big.amount == stop // members
    depth = 0  # what the owner has counted: m2's reported use
    used_by_m2 = 0
    for step in range(100):
        at = 0.01 * (step + 1)
        on = depth > stop  # the owner's flow decision
        grant = owner.grant(KEY, Request("m2", NAME, at), at, on=on, depth=depth, **kwargs)
        if grant is None:
            break
        owner.settle(KEY, Report("m2", NAME, grant.grant_id, grant.amount, 0))
        depth += grant.amount
        used_by_m2 += grant.amount
    confirmed = big.amount + used_by_m2  # m1's whole grant may be in use
    assert confirmed <= stop + members * batch
    assert used_by_m2 > batch  # m2 was topped up more than once meanwhile


def test_a_forgotten_ledger_never_gives_a_grant_id_twice() -> None:
    owner = OwnerBook("m1", batch=10, lease=2.0, epoch=1, started_at=0.0)
    first = owner.grant(KEY, Request("m2", NAME, 0.0), 0.0, on=False)
    assert first is not None
    assert not owner.forget(KEY)  # outstanding: kept
    owner.expire(3.0)
    assert owner.forget(KEY)
    assert KEY not in owner.ledgers
    again = owner.grant(KEY, Request("m2", NAME, 3.0), 3.0, on=False)
    assert again is not None
    assert again.grant_id != first.grant_id


def test_a_member_book_forgets_a_queue_only_when_nothing_is_in_hand() -> None:
    book = _book()
    book.publish(KEY, 10, now=0.0)  # held
    assert not book.forget_idle(KEY, now=0.0)
    (request,) = book.requests(now=0.0)
    book.granted(KEY, _grant(request), now=0.01)  # paid: a grant in hand
    assert not book.forget_idle(KEY, now=0.02)
    book.requests(now=3.0)  # the grant is over: reported and dropped
    assert book.forget_idle(KEY, now=3.0)
    assert KEY not in book.queues


def test_a_queue_is_overdue_once_unknown_for_the_whole_time_and_starts_over_when_seen() -> None:
    known: set[tuple[str, str]] = set()
    missing = Missing(after=3.0)
    a, b = ("/", "a"), ("/", "b")

    def overdue(now: float, *keys: tuple[str, str]) -> list[tuple[str, str]]:
        return sorted(missing.overdue(keys, lambda v, q: (v, q) in known, now))

    assert overdue(0.0, a, b) == []
    assert overdue(2.9, a, b) == []
    known.add(b)  # a snapshot lists b again: its absence starts over
    assert overdue(3.0, a, b) == [a]
    known.clear()  # b unknown again from 5.9
    assert overdue(5.9, a, b) == [a]  # still due until dealt with
    missing.forget(a)
    assert overdue(6.0, a, b) == []  # a counts from 6.0
    assert overdue(6.0, b) == []  # a no longer of interest: dropped
    assert overdue(8.9, a, b) == [b]  # so a counts from 8.9
    assert overdue(11.9, a, b) == [a, b]
