"""Held publisher confirms: splitting, holding, releasing, nacks."""

from __future__ import annotations

from rabbitflow_broker.engine.confirms import Confirm, ConfirmTracker, Route

A: Route = frozenset({"a"})
B: Route = frozenset({"b"})


def _blocked(*queues: str):  # type: ignore[no-untyped-def]
    stopped = set(queues)
    return lambda route: bool(route & stopped)


def _tracker(*routes: Route) -> ConfirmTracker:
    tracker = ConfirmTracker()
    for route in routes:
        tracker.published(route)
    return tracker


def test_sequence_numbers_start_at_one() -> None:
    tracker = ConfirmTracker()
    assert [tracker.published(A), tracker.published(A)] == [1, 2]


def test_unblocked_ack_passes_as_is() -> None:
    tracker = _tracker(A)
    assert tracker.upstream_ack(1, False, _blocked())[0] == [Confirm(1, False, True)]


def test_multiple_ack_over_free_queues_stays_multiple() -> None:
    tracker = _tracker(A, A, A)
    assert tracker.upstream_ack(3, True, _blocked())[0] == [Confirm(3, True, True)]


def test_ack_to_blocked_queue_is_held() -> None:
    tracker = _tracker(A)
    assert tracker.upstream_ack(1, False, _blocked("a")) == ([], [A])
    assert tracker.held == 1


def test_multiple_ack_is_split_around_a_held_tag() -> None:
    tracker = _tracker(B, A, B)
    out = tracker.upstream_ack(3, True, _blocked("a"))[0]
    assert out == [Confirm(1, False, True), Confirm(3, False, True)]
    assert tracker.held == 1


def test_held_tag_is_released_once_queue_is_free() -> None:
    tracker = _tracker(A)
    tracker.upstream_ack(1, False, _blocked("a"))
    assert tracker.release(_blocked("a")) == []
    assert tracker.release(_blocked()) == [Confirm(1, False, True)]
    assert tracker.held == 0


def test_a_held_confirm_whose_block_lifted_goes_before_a_newer_one() -> None:
    # The block lifts (a cluster grant) before the hub re-checks what is held:
    # the next upstream ack takes the older held confirm along, in order.
    tracker = _tracker(A, A)
    tracker.upstream_ack(1, False, _blocked("a"))
    assert tracker.upstream_ack(2, False, _blocked())[0] == [Confirm(2, True, True)]
    assert tracker.held == 0
    assert tracker.release(_blocked()) == []


def test_release_of_a_prefix_uses_one_multiple_ack() -> None:
    tracker = _tracker(A, A, A)
    tracker.upstream_ack(3, True, _blocked("a"))
    assert tracker.release(_blocked()) == [Confirm(3, True, True)]


def test_never_multiple_over_a_still_unconfirmed_tag() -> None:
    tracker = _tracker(A, A, A)
    tracker.upstream_ack(1, False, _blocked("a"))
    tracker.upstream_ack(3, False, _blocked("a"))
    # Tag 2 is not yet confirmed upstream: 1 may go alone, 3 only singly.
    assert tracker.release(_blocked()) == [Confirm(1, False, True), Confirm(3, False, True)]


def test_route_to_several_queues_waits_for_all() -> None:
    tracker = _tracker(A | B)
    tracker.upstream_ack(1, False, _blocked("a", "b"))
    assert tracker.release(_blocked("b")) == []
    assert tracker.release(_blocked()) == [Confirm(1, False, True)]


def test_unroutable_publish_is_never_held() -> None:
    tracker = _tracker(frozenset())
    assert tracker.upstream_ack(1, False, lambda route: True)[0] == [Confirm(1, False, True)]


def test_nack_passes_even_to_a_blocked_queue() -> None:
    tracker = _tracker(A)
    confirms, routes = tracker.upstream_nack(1, False)
    assert confirms == [Confirm(1, False, False)]
    assert routes == [A]


def test_ack_of_unknown_tag_sends_nothing() -> None:
    tracker = _tracker(A)
    assert tracker.upstream_ack(5, False, _blocked())[0] == []


def test_multiple_ack_tag_zero_covers_everything() -> None:
    tracker = _tracker(A, A)
    assert tracker.upstream_ack(0, True, _blocked())[0] == [Confirm(2, True, True)]


def test_ack_upto_passes_a_free_multiple_ack_and_forgets_what_it_covers() -> None:
    tracker = _tracker(A, B, A, A)
    assert tracker.ack_upto(3, _blocked())
    assert tracker.outstanding == 1
    assert tracker.upstream_ack(4, False, _blocked())[0] == [Confirm(4, False, True)]


def test_ack_upto_changes_nothing_when_a_covered_route_is_blocked() -> None:
    tracker = _tracker(A, B, A)
    assert not tracker.ack_upto(3, _blocked("b"))
    assert tracker.outstanding == 3
    # The slow path then splits it as before.
    assert tracker.upstream_ack(3, True, _blocked("b")) == (
        [Confirm(1, False, True), Confirm(3, False, True)],
        [B],
    )


def test_ack_upto_leaves_it_to_the_slow_path_while_a_confirm_is_held() -> None:
    tracker = _tracker(B, A, A)
    tracker.upstream_ack(1, False, _blocked("b"))  # 1 held
    assert not tracker.ack_upto(3, _blocked())
    assert tracker.upstream_ack(3, True, _blocked("b"))[0] == [
        Confirm(2, False, True),
        Confirm(3, False, True),
    ]


def test_ack_upto_of_nothing_unconfirmed_or_tag_zero_is_not_taken() -> None:
    tracker = _tracker(A, A)
    assert tracker.ack_upto(2, _blocked())
    assert not tracker.ack_upto(2, _blocked())
    assert not _tracker(A).ack_upto(0, _blocked())
