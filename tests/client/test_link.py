"""The connection link's recovery state machine: transitions as data."""

import pytest

from rabbitflow._exceptions import ConnectionLostError, IllegalStateError
from rabbitflow._recovery import (
    IllegalLinkTransitionError,
    Link,
    LinkEvent,
    LinkMachine,
    LinkState,
)


def machine(*events: LinkEvent) -> LinkMachine:
    link = LinkMachine()
    for event in events:
        link.handle(event)
    return link


def test_a_loss_of_an_open_link_starts_recovery_and_detaches() -> None:
    step = LinkMachine().handle(LinkEvent.LOST)
    assert (step.new, step.detach, step.start_recovery) == (Link.DISCONNECTED, True, True)


@pytest.mark.parametrize(
    "before",
    [
        (LinkEvent.LOST, LinkEvent.ATTEMPT),  # while opening
        (LinkEvent.LOST, LinkEvent.ATTEMPT, LinkEvent.CONNECTED),  # while restoring
    ],
)
@pytest.mark.parametrize("event", [LinkEvent.LOST, LinkEvent.ATTEMPT_FAILED])
def test_a_loss_during_recovery_goes_back_to_disconnected_and_detaches_again(
    before: tuple[LinkEvent, ...], event: LinkEvent
) -> None:
    step = machine(*before).handle(event)
    assert (step.new, step.detach, step.start_recovery) == (Link.DISCONNECTED, True, False)


def test_a_restore_that_finishes_after_a_loss_is_stale() -> None:
    link = machine(LinkEvent.LOST, LinkEvent.ATTEMPT, LinkEvent.CONNECTED, LinkEvent.LOST)
    assert link.handle(LinkEvent.RESTORED).new is Link.DISCONNECTED
    assert not link.usable


def test_a_full_recovery_opens_the_link() -> None:
    link = machine(LinkEvent.LOST, LinkEvent.ATTEMPT, LinkEvent.CONNECTED, LinkEvent.RESTORED)
    assert link.usable


def test_giving_up_fails_the_link() -> None:
    assert machine(LinkEvent.LOST, LinkEvent.GIVE_UP).state is Link.FAILED


def test_close_wins_from_every_state() -> None:
    for state in Link:
        link = LinkMachine()
        link.state = state
        assert link.handle(LinkEvent.CLOSE).new is Link.CLOSED


def test_an_illegal_event_names_state_and_event() -> None:
    with pytest.raises(IllegalLinkTransitionError, match=r"RESTORED .* state OPEN"):
        LinkMachine().handle(LinkEvent.RESTORED)


def test_the_link_state_ignores_the_loss_of_a_transport_it_replaced() -> None:
    state = LinkState()
    first = state.new_transport()
    state.use(first)
    assert state.lost(first) is not None
    assert state.attempt()
    second = state.new_transport()
    assert state.connected(second)
    assert state.lost(first) is None
    assert state.is_current(second)


def test_a_restore_after_a_loss_fails_the_attempt() -> None:
    state = LinkState()
    state.use(state.new_transport())
    state.lost(1)
    state.attempt()
    generation = state.new_transport()
    state.connected(generation)
    state.lost(generation)
    with pytest.raises(ConnectionLostError, match="lost again while it was restored"):
        state.restored()


def test_once_recovery_gave_up_waiting_for_the_link_raises_its_error() -> None:
    state = LinkState()
    state.use(state.new_transport())
    state.lost(1)
    error = ConnectionLostError("recovery gave up")
    assert state.give_up(error)
    with pytest.raises(ConnectionLostError) as raised:
        state.check_usable()
    assert raised.value is error


def test_a_closed_link_neither_attempts_nor_counts_a_recovery() -> None:
    state = LinkState()
    state.use(state.new_transport())
    state.lost(1)
    assert state.close()
    assert not state.close()
    assert not state.attempt()
    assert not state.recovered()
    with pytest.raises(IllegalStateError, match="closed"):
        state.check_usable()


def test_a_block_of_the_transport_being_opened_waits_until_it_is_in_use() -> None:
    state = LinkState()
    state.use(state.new_transport())
    state.lost(1)
    state.attempt()
    second = state.new_transport()
    assert not state.block_applies(second, "memory")  # not in use yet: kept
    assert state.connected(second)
    assert state.blocked_early() == "memory"
    assert state.blocked_early() is None  # handed over once
    assert state.block_applies(second, None)


def test_an_unblock_while_the_transport_is_opened_clears_its_block() -> None:
    state = LinkState()
    first = state.new_transport()
    state.block_applies(first, "memory")
    state.block_applies(first, None)
    state.use(first)
    assert state.blocked_early() is None


def test_the_block_of_a_transport_that_never_came_into_use_is_dropped() -> None:
    state = LinkState()
    failed = state.new_transport()
    state.block_applies(failed, "memory")
    second = state.new_transport()
    assert not state.block_applies(failed, "disk")  # a late event of the failed one
    state.use(second)
    assert state.blocked_early() is None


def test_a_channel_is_held_only_while_its_transport_stays_in_use_and_open() -> None:
    state = LinkState()
    state.use(state.new_transport())
    opened_on = state.in_use
    assert state.holds(opened_on)
    state.lost(opened_on)
    assert not state.holds(opened_on)  # recovering: the loss left it out
    state.attempt()
    second = state.new_transport()
    state.connected(second)
    state.restored()
    assert state.holds(second)
    assert not state.holds(opened_on)  # the old transport's channel is stale
