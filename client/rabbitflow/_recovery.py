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

``LinkState`` holds the machine with what goes with it: which transport is
current, the error once recovery gave up, how often it recovered; both
drivers feed it the same way.  It also keeps the connection.blocked of the
transport being opened: the broker may send it as soon as the handshake
ends, before the driver has that transport in use, and it holds from then on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._exceptions import ConnectionLostError, IllegalStateError, JMSException

__all__ = [
    "LINK_TRANSITIONS",
    "IllegalLinkTransitionError",
    "Link",
    "LinkEvent",
    "LinkMachine",
    "LinkState",
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


class LinkState:
    """A connection's link and its transports: which one is current (by
    generation, so that the events of a replaced one are ignored), the error
    once recovery gave up, how often it recovered.  The driver guards it
    (the sync SDK under its lock) and does the I/O."""

    def __init__(self) -> None:
        self._link = LinkMachine()
        self._generation = 0  # of the newest transport
        self._current = 0  # of the transport in use
        # connection.blocked's reason from a transport not yet in use, by generation
        self._blocked_early: tuple[int, str] | None = None
        self.error: JMSException | None = None  # why recovery gave up
        self.reconnect_count = 0

    @property
    def state(self) -> Link:
        """Where the link is."""
        return self._link.state

    @property
    def usable(self) -> bool:
        """True when the application may use the connection."""
        return self._link.usable

    @property
    def closed(self) -> bool:
        """True once the application closed the connection."""
        return self._link.closed

    @property
    def recovering(self) -> bool:
        """True while recovery runs."""
        return self._link.recovering

    def new_transport(self) -> int:
        """The generation of a transport about to be opened."""
        self._generation += 1
        return self._generation

    def use(self, generation: int) -> None:
        """The first transport is open."""
        self._current = generation

    @property
    def in_use(self) -> int:
        """The generation of the transport in use: a channel opened meanwhile
        is on it as long as it stays in use (and the link open)."""
        return self._current

    def is_current(self, generation: int) -> bool:
        """True for the events of the transport in use."""
        return generation == self._current

    def holds(self, opened_on: int) -> bool:
        """True when a channel opened on transport ``opened_on`` (``in_use``
        then) is still on the transport in use, and the link open: a new
        producer or consumer registered with it now is one that a later loss
        detaches and its recovery restores.  False: a loss came after the
        channel opened, and its recovery left it out."""
        return self._link.usable and opened_on == self._current

    def block_applies(self, generation: int, reason: str | None) -> bool:
        """connection.blocked (``reason``) or unblocked (None) from a transport:
        True when it is the one in use (the driver tells the producers).  That
        of the newest transport, still being opened, is kept until ``use`` or
        ``connected`` put it in use (``blocked_early`` hands it over then);
        that of an older one is ignored."""
        if generation == self._current:
            return True
        if generation == self._generation:
            self._blocked_early = None if reason is None else (generation, reason)
        return False

    def blocked_early(self) -> str | None:
        """The reason the transport just put in use was blocked while it was
        opened (None: it was not, or unblocked since); the driver blocks the
        connection with it before restoring anything on that transport."""
        early, self._blocked_early = self._blocked_early, None
        if early is None or early[0] != self._current:
            return None  # a transport that never came into use
        return early[1]

    def lost(self, generation: int) -> Step | None:
        """A transport died; None when it was already replaced (or a failed attempt's)."""
        if generation != self._current:
            return None
        return self._link.handle(LinkEvent.LOST)

    def attempt(self) -> bool:
        """A recovery attempt starts; False once closed (no attempt)."""
        if self._link.closed:
            return False
        self._link.handle(LinkEvent.ATTEMPT)
        return True

    def connected(self, generation: int) -> bool:
        """The attempt's transport is open and now in use; False when the
        connection was closed meanwhile (the driver closes that transport)."""
        if self._link.closed:
            return False
        self._current = generation
        self._link.handle(LinkEvent.CONNECTED)
        return True

    def restored(self) -> None:
        """Every session is restored on the new transport.

        Raises:
            ConnectionLostError: it was lost meanwhile (the attempt failed).
        """
        if self._link.handle(LinkEvent.RESTORED).new is not Link.OPEN:
            raise ConnectionLostError("the connection was lost again while it was restored")

    def attempt_failed(self) -> bool:
        """The attempt raised; True when every producer and consumer must be
        put back into "disconnected"."""
        return self._link.handle(LinkEvent.ATTEMPT_FAILED).detach

    def recovered(self) -> bool:
        """The retry loop succeeded; False when the connection was closed meanwhile."""
        if self._link.closed:
            return False
        self.reconnect_count += 1
        return True

    def give_up(self, error: JMSException) -> bool:
        """Recovery gave up with ``error``; False when already closed."""
        if self._link.closed:
            return False
        self._link.handle(LinkEvent.GIVE_UP)
        self.error = error
        return True

    def close(self) -> bool:
        """The application closes the connection; False when it already was."""
        if self._link.closed:
            return False
        self._link.handle(LinkEvent.CLOSE)
        return True

    def check_open(self) -> None:
        """Refuse a closed connection.

        Raises:
            IllegalStateError: the connection is closed.
        """
        if self._link.closed:
            raise IllegalStateError("connection is closed")

    def check_usable(self) -> bool:
        """True when open, False while recovering (wait and ask again).

        Raises:
            IllegalStateError: closed.
            JMSException: recovery gave up (its error).
        """
        state = self._link.state
        if state is Link.OPEN:
            return True
        self.check_open()
        if state is Link.FAILED:
            assert self.error is not None
            raise self.error
        return False
