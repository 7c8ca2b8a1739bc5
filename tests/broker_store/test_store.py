"""The store quota machine (pure, clock passed in)."""

from __future__ import annotations

import datetime as dt

import pytest

from rabbitflow_broker.engine.store import (
    TRANSITIONS,
    StoreQuota,
    StoreState,
    StoreTransitionError,
    validate_quota,
)
from rabbitflow_broker.events import StoreOverfull, StoreUnderfull

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _quota(overfull: int = 1000, underfull: int = 500) -> StoreQuota:
    return StoreQuota("vh", overfull, underfull)


def test_size_above_overfull_emits_mst_1008() -> None:
    quota = _quota()
    event = quota.observe(1001, NOW)
    assert isinstance(event, StoreOverfull)
    assert (event.vhost, event.size, event.overfull_size, event.underfull_size) == (
        "vh",
        1001,
        1000,
        500,
    )
    assert (
        event.line()
        == "[vh(/vh)/ms(RabbitMQ)] MST-1008 : Store overfull, flow control will be enforced"
    )
    assert quota.overfull


def test_size_equal_to_overfull_is_not_overfull() -> None:
    assert _quota().observe(1000, NOW) is None


def test_overfull_is_logged_once_per_transition() -> None:
    quota = _quota()
    events = [quota.observe(size, NOW) for size in (1001, 2000, 5000, 800)]
    assert [type(e) for e in events if e is not None] == [StoreOverfull]
    assert quota.overfull_count == 1


def test_between_underfull_and_overfull_the_state_holds() -> None:
    quota = _quota()
    quota.observe(1001, NOW)
    assert quota.observe(500, NOW) is None
    assert quota.overfull


def test_size_below_underfull_emits_mst_1009() -> None:
    quota = _quota()
    quota.observe(1001, NOW)
    event = quota.observe(499, NOW)
    assert isinstance(event, StoreUnderfull)
    assert event.message == "Store overfull condition cleared"
    assert not quota.overfull


def test_second_episode_counts_again() -> None:
    quota = _quota()
    for size in (1001, 10, 1001):
        quota.observe(size, NOW)
    assert quota.overfull_count == 2


def test_zero_overfull_turns_the_quota_off() -> None:
    quota = _quota(0, 0)
    assert quota.observe(10**12, NOW) is None
    assert not quota.overfull
    assert quota.snapshot().size == 10**12


def test_zero_underfull_means_the_overfull_size() -> None:
    quota = _quota(1000, 0)
    quota.observe(1001, NOW)
    assert quota.observe(1000, NOW) is None
    assert isinstance(quota.observe(999, NOW), StoreUnderfull)


def test_overfull_below_underfull_is_refused() -> None:
    with pytest.raises(ValueError, match="overfull size 500 is below the underfull size 1,000"):
        validate_quota(500, 1000)


def test_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        _quota().observe(-1, NOW)


def test_transitions_are_a_table_of_the_two_moves() -> None:
    assert set(TRANSITIONS.values()) == {StoreState.OVERFULL, StoreState.UNDERFULL}
    assert len(TRANSITIONS) == 2


def test_illegal_move_names_state_and_trigger() -> None:
    quota = _quota()
    with pytest.raises(StoreTransitionError, match="from underfull on cleared"):
        quota._move(next(t for s, t in TRANSITIONS if s is StoreState.OVERFULL))


def test_snapshot_reports_source_time_and_count() -> None:
    quota = StoreQuota("vh", 1000, 500, source="disk")
    quota.observe(2000, NOW)
    snap = quota.snapshot()
    assert (snap.vhost, snap.size, snap.overfull, snap.source, snap.overfull_count) == (
        "vh",
        2000,
        True,
        "disk",
        1,
    )
    assert snap.updated_at == "2026-01-01T00:00:00.000Z"
    assert snap.to_json()["overfullSize"] == 1000


def test_snapshot_before_any_measurement_has_no_time() -> None:
    assert _quota().snapshot().updated_at is None
