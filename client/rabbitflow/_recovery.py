"""The connection's link to the broker and its recovery, sans-IO.

States and transitions are data (``LINK_TRANSITIONS``); an illegal move
raises ``IllegalLinkTransitionError``.  The driver (``_connection.py``) runs
the attempts on a recovery thread and feeds what happened in::

    OPEN --LOST--> DISCONNECTED --ATTEMPT--> CONNECTING --CONNECTED--> RESTORING
      ^                ^   |                     |                        |
      |                |   +--GIVE_UP--> FAILED  |                        |
      |                +---- LOST / ATTEMPT_FAILED (from either) ---------+
      +------------------------------ RESTORED ---------------------------+

A loss at any point of recovery - while opening, while restoring any
session, while re-sending - goes back to DISCONNECTED.  ``handle`` says
whether the driver must then put every producer and consumer back into
"disconnected" (``Step.detach``): each producer re-queues everything
unconfirmed for a re-send in order with fresh confirm tags on its next
channel, each consumer drops what its lost channel buffered.  A RESTORED
that arrives after such a loss is stale: the link stays DISCONNECTED and the
next attempt starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._exceptions import IllegalStateError

__all__ = [
    "LINK_TRANSITIONS",
    "IllegalLinkTransitionError",
    "Link",
    "LinkEvent",
    "LinkMachine",
    "Step",
]


class Link(enum.Enum):
    """Where the connection's link to the broker is."""

    OPEN = "open"
    DISCONNECTED = "disconnected"  # lost; the next attempt is due
    CONNECTING = "connecting"  # an attempt is opening a new transport
    RESTORING = "restoring"  # re-declaring, re-opening channels, re-sending
    FAILED = "failed"  # recovery gave up
    CLOSED = "closed"


class LinkEvent(enum.Enum):
    """What can happen to the link."""

    LOST = "lost"  # the current transport died
    ATTEMPT = "attempt"  # the recovery thread starts an attempt
    CONNECTED = "connected"  # the attempt's transport is open
    RESTORED = "restored"  # every session is restored on it
    ATTEMPT_FAILED = "attempt_failed"  # the attempt raised
    GIVE_UP = "give_up"  # the retry policy is exhausted
    CLOSE = "close"  # the application closed the connection


_L, _E = Link, LinkEvent
LINK_TRANSITIONS: dict[tuple[Link, LinkEvent], Link] = {
    (_L.OPEN, _E.LOST): _L.DISCONNECTED,
    (_L.DISCONNECTED, _E.LOST): _L.DISCONNECTED,
    (_L.DISCONNECTED, _E.ATTEMPT): _L.CONNECTING,
    (_L.DISCONNECTED, _E.ATTEMPT_FAILED): _L.DISCONNECTED,
    (_L.DISCONNECTED, _E.RESTORED): _L.DISCONNECTED,  # stale: lost meanwhile
    (_L.DISCONNECTED, _E.GIVE_UP): _L.FAILED,
    (_L.CONNECTING, _E.CONNECTED): _L.RESTORING,
    (_L.CONNECTING, _E.LOST): _L.DISCONNECTED,
    (_L.CONNECTING, _E.ATTEMPT_FAILED): _L.DISCONNECTED,
    (_L.RESTORING, _E.RESTORED): _L.OPEN,
    (_L.RESTORING, _E.LOST): _L.DISCONNECTED,
    (_L.RESTORING, _E.ATTEMPT_FAILED): _L.DISCONNECTED,
    (_L.FAILED, _E.LOST): _L.FAILED,
}
for _state in Link:
    LINK_TRANSITIONS[(_state, _E.CLOSE)] = _L.CLOSED
for _event in LinkEvent:  # nothing moves a closed link
    LINK_TRANSITIONS[(_L.CLOSED, _event)] = _L.CLOSED


class IllegalLinkTransitionError(IllegalStateError):
    """An event that cannot happen in the link's current state."""

    def __init__(self, state: Link, event: LinkEvent) -> None:
        super().__init__(f"link event {event.name} is not allowed in state {state.name}")
        self.state = state
        self.event = event


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one event."""

    old: Link
    new: Link
    detach: bool  # put every producer and consumer back into "disconnected"
    start_recovery: bool  # an open link was lost: start the recovery thread


class LinkMachine:
    """The link state machine (see ``LINK_TRANSITIONS``)."""

    def __init__(self) -> None:
        self.state = Link.OPEN

    @property
    def usable(self) -> bool:
        """True when the application may use the connection."""
        return self.state is Link.OPEN

    @property
    def closed(self) -> bool:
        """True once the application closed the connection."""
        return self.state is Link.CLOSED

    @property
    def recovering(self) -> bool:
        """True while recovery runs."""
        return self.state in (Link.DISCONNECTED, Link.CONNECTING, Link.RESTORING)

    def handle(self, event: LinkEvent) -> Step:
        """Apply ``event``.

        Raises:
            IllegalLinkTransitionError: ``event`` cannot happen in this state.
        """
        old = self.state
        try:
            new = LINK_TRANSITIONS[(old, event)]
        except KeyError:
            raise IllegalLinkTransitionError(old, event) from None
        self.state = new
        # Into DISCONNECTED always detaches (idempotent): a restore still
        # running when the loss came may have attached some after it.
        detach = new is Link.DISCONNECTED
        return Step(old, new, detach, start_recovery=old is Link.OPEN and new is Link.DISCONNECTED)
