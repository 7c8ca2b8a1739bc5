"""The connection link's recovery state machine: transitions as data."""

import pytest

from rabbitflow._recovery import IllegalLinkTransitionError, Link, LinkEvent, LinkMachine


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
