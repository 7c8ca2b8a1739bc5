"""The epoch claim's phases: a table of moves, late answers ignored."""

from __future__ import annotations

import pytest

from rabbitflow_broker.engine.cluster_claim import (
    MOVES,
    ClaimEvent,
    ClaimPhase,
    EpochClaim,
    IllegalClaimMove,
)
from rabbitflow_broker.engine.errors import StateError


def test_a_claim_reads_records_and_owns_with_one_above_everything() -> None:
    claim = EpochClaim()
    assert claim.start() is True
    assert claim.phase is ClaimPhase.READING
    assert claim.start() is False  # handed again while reading: one claim
    assert claim.read(recorded=4, heard=6) == 7
    assert claim.phase is ClaimPhase.RECORDING
    assert claim.recorded(7, heard=6) is True
    assert claim.phase is ClaimPhase.IDLE
    assert not claim.under_way


def test_an_epoch_as_high_heard_while_recording_reads_again() -> None:
    claim = EpochClaim()
    claim.start()
    epoch = claim.read(recorded=None, heard=0)
    assert epoch == 1
    assert claim.recorded(epoch, heard=1) is False
    assert claim.phase is ClaimPhase.READING
    assert claim.read(recorded=1, heard=1) == 2


def test_answers_that_belong_to_no_claim_are_ignored() -> None:
    claim = EpochClaim()
    assert claim.read(recorded=3, heard=0) == 0  # no read asked for
    assert claim.recorded(1, heard=0) is None
    assert claim.phase is ClaimPhase.IDLE
    claim.start()
    claim.read(recorded=3, heard=0)
    assert claim.recorded(3, heard=0) is None  # not this claim's epoch
    assert claim.phase is ClaimPhase.RECORDING


def test_losing_the_bus_drops_the_claim_and_its_backlog_in_any_phase() -> None:
    for steps in (0, 1, 2):
        claim = EpochClaim()
        if steps:
            claim.start()
            assert claim.keep({"kind": "req"}) is True
        if steps == 2:
            claim.read(recorded=1, heard=0)
        claim.drop()
        assert (claim.phase, claim.epoch, claim.take()) == (ClaimPhase.IDLE, 0, [])
        assert claim.keep({"kind": "req"}) is False


def test_a_move_outside_the_table_raises_naming_phase_and_event() -> None:
    assert (ClaimPhase.IDLE, ClaimEvent.READ) not in MOVES
    claim = EpochClaim()
    with pytest.raises(IllegalClaimMove) as raised:
        claim._move(ClaimEvent.READ)
    assert isinstance(raised.value, StateError)
    assert str(raised.value) == "epoch claim: no move from IDLE on READ"
    assert claim.phase is ClaimPhase.IDLE
