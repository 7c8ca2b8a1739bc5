"""The lifecycle of one relayed connection, as data (pure).

Like h11's ``_state.py``, each side of the handshake is an enum and a
table of the moves it may make, and the relay's mode is a third one; a
move the table does not hold raises :class:`TransitionError`, which names
the state and the event.  Three machines rather than one because they move
independently: a client may send its Tune-Ok before RabbitMQ's Tune has
reached it, and RabbitMQ may close (putting the relay in passthrough) at any
step of the handshake, after which closing still depends on how far the
handshake got::

    client:    HEADER --header--> LOGIN --tune-ok--> TUNED
    upstream:  CONNECTING --connected--> LOGIN --tune--> LOGGED_IN --open-ok--> OPEN
    mode:      RELAYING --refuse / upstream close--> PASSTHROUGH
               RELAYING | PASSTHROUGH --close--> CLOSING --done--> CLOSED
               (any mode but CLOSED) --done--> CLOSED

``HEADER``: nothing scanned yet (the protocol header is due); ``LOGIN`` on
the client's side: the header was good, frames are scanned; ``TUNED``: the
client sent Tune-Ok (its frame-max holds from then on).  On RabbitMQ's
side, ``CONNECTING``: the upstream socket is not open yet (the client's bytes
wait); ``LOGGED_IN``: RabbitMQ sent Tune, it accepted the login; ``OPEN``:
Open-Ok went to the client.  ``PASSTHROUGH``: the client's bytes go
upstream uninterpreted, RabbitMQ judges them; ``CLOSING``: the gateway sent
Connection.Close and waits for Close-Ok (until :attr:`Lifecycle.closing_at`);
``CLOSED``: nothing more is read, the driver closes both sockets.
"""

from __future__ import annotations

import enum
from typing import Final

from rabbitflow_broker.engine.errors import TransitionError

__all__ = ["ClientState", "Event", "Lifecycle", "Mode", "TransitionError", "UpstreamState"]


class ClientState(enum.Enum):
    """How far the client got in the handshake."""

    HEADER = "header"
    LOGIN = "login"
    TUNED = "tuned"


class UpstreamState(enum.Enum):
    """How far RabbitMQ got in the handshake."""

    CONNECTING = "connecting"
    LOGIN = "login"
    LOGGED_IN = "logged in"
    OPEN = "open"


class Mode(enum.Enum):
    """What the engine does with the client's bytes."""

    RELAYING = "relaying"
    PASSTHROUGH = "passthrough"
    CLOSING = "closing"
    CLOSED = "closed"


class Event(enum.Enum):
    """What moves a machine."""

    CLIENT_HEADER = "client protocol header"
    CLIENT_TUNE_OK = "client Connection.Tune-Ok"
    UPSTREAM_CONNECTED = "upstream connected"
    UPSTREAM_TUNE = "upstream Connection.Tune"
    UPSTREAM_OPEN_OK = "upstream Connection.Open-Ok"
    PASS = "passthrough"
    CLOSE = "gateway Connection.Close"
    DONE = "closed"


_CLIENT_MOVES: Final[dict[tuple[ClientState, Event], ClientState]] = {
    (ClientState.HEADER, Event.CLIENT_HEADER): ClientState.LOGIN,
    (ClientState.LOGIN, Event.CLIENT_TUNE_OK): ClientState.TUNED,
}
_UPSTREAM_MOVES: Final[dict[tuple[UpstreamState, Event], UpstreamState]] = {
    (UpstreamState.CONNECTING, Event.UPSTREAM_CONNECTED): UpstreamState.LOGIN,
    (UpstreamState.LOGIN, Event.UPSTREAM_TUNE): UpstreamState.LOGGED_IN,
    (UpstreamState.LOGGED_IN, Event.UPSTREAM_OPEN_OK): UpstreamState.OPEN,
}
_MODE_MOVES: Final[dict[tuple[Mode, Event], Mode]] = {
    (Mode.RELAYING, Event.PASS): Mode.PASSTHROUGH,
    (Mode.PASSTHROUGH, Event.PASS): Mode.PASSTHROUGH,  # refused, then RabbitMQ closes
    (Mode.CLOSING, Event.PASS): Mode.CLOSING,  # RabbitMQ closes while the gateway does
    (Mode.RELAYING, Event.CLOSE): Mode.CLOSING,
    (Mode.PASSTHROUGH, Event.CLOSE): Mode.CLOSING,
    (Mode.RELAYING, Event.DONE): Mode.CLOSED,
    (Mode.PASSTHROUGH, Event.DONE): Mode.CLOSED,
    (Mode.CLOSING, Event.DONE): Mode.CLOSED,
}
#: The events of each side of the handshake.
_CLIENT_EVENTS: Final = frozenset(event for _, event in _CLIENT_MOVES)
_UPSTREAM_EVENTS: Final = frozenset(event for _, event in _UPSTREAM_MOVES)

# Module-level aliases: compiled, comparing with these is a load of a C
# static, where ``Mode.RELAYING`` would be an attribute lookup (hot path).
RELAYING: Final = Mode.RELAYING
PASSTHROUGH: Final = Mode.PASSTHROUGH
CLOSING: Final = Mode.CLOSING
CLOSED: Final = Mode.CLOSED
_HEADER: Final = ClientState.HEADER
_TUNED: Final = ClientState.TUNED
_CONNECTING: Final = UpstreamState.CONNECTING
_LOGGED_IN: Final = UpstreamState.LOGGED_IN
_OPEN: Final = UpstreamState.OPEN


class Lifecycle:
    """The three machines of one connection, moved only by :meth:`move`."""

    def __init__(self) -> None:
        self.client = _HEADER
        self.upstream = _CONNECTING
        self.mode = RELAYING
        #: When CLOSING gives up waiting for the client's Close-Ok.
        self.closing_at = 0.0

    def __repr__(self) -> str:
        return (
            f"Lifecycle(client={self.client.name}, upstream={self.upstream.name}, "
            f"mode={self.mode.name})"
        )

    def can(self, event: Event) -> bool:
        """Whether ``event`` is a legal move now."""
        if event in _CLIENT_EVENTS:
            return (self.client, event) in _CLIENT_MOVES
        if event in _UPSTREAM_EVENTS:
            return (self.upstream, event) in _UPSTREAM_MOVES
        return (self.mode, event) in _MODE_MOVES

    def move(self, event: Event) -> None:
        """Make the move ``event`` names.

        Raises:
            TransitionError: the table holds no such move from the present state.
        """
        if event in _CLIENT_EVENTS:
            client = _CLIENT_MOVES.get((self.client, event))
            if client is None:
                raise TransitionError(self.client.name, event.value)
            self.client = client
        elif event in _UPSTREAM_EVENTS:
            upstream = _UPSTREAM_MOVES.get((self.upstream, event))
            if upstream is None:
                raise TransitionError(self.upstream.name, event.value)
            self.upstream = upstream
        else:
            mode = _MODE_MOVES.get((self.mode, event))
            if mode is None:
                raise TransitionError(self.mode.name, event.value)
            self.mode = mode

    def close(self, deadline: float) -> None:
        """The gateway sent Connection.Close: wait for Close-Ok until ``deadline``.

        Raises:
            TransitionError: already closing or closed.
        """
        self.move(Event.CLOSE)
        self.closing_at = deadline

    # -- what the engine asks ---------------------------------------------------

    @property
    def connecting(self) -> bool:
        """The upstream socket is not open yet."""
        return self.upstream is _CONNECTING

    @property
    def logged_in(self) -> bool:
        """RabbitMQ accepted the login (it sent Tune)."""
        upstream = self.upstream
        return upstream is _LOGGED_IN or upstream is _OPEN

    @property
    def open(self) -> bool:
        """Open-Ok went to the client."""
        return self.upstream is _OPEN

    @property
    def scanning(self) -> bool:
        """The client's frames are scanned (its protocol header was good)."""
        return self.client is not _HEADER

    @property
    def tuned(self) -> bool:
        """The client sent Tune-Ok."""
        return self.client is _TUNED

    @property
    def ending(self) -> bool:
        """Closing or closed: nothing the client sends is relayed any more."""
        mode = self.mode
        return mode is CLOSING or mode is CLOSED
