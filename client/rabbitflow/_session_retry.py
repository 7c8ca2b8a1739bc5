"""A sync session's broker operations across connection losses: one that a
loss interrupts runs again once the connection recovered, and a new
channel is attached to its producer or consumer on one transport."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from ._exceptions import ConnectionLostError
from ._transport_channel import TransportChannel

__all__ = ["ATTEMPTS", "LinkView", "SessionRetry", "lost_since"]

R = TypeVar("R")

ATTEMPTS = 5  # of an operation that a connection loss interrupts


class _Link(Protocol):
    """What of its connection's link tells whether a loss came (a sync or an
    asyncio session's ``SessionContext``)."""

    @property
    def recovering_or_lost(self) -> Callable[[], bool]:
        """Recovery runs, or the transport in use is lost (and the link not told yet)."""

    @property
    def holds(self) -> Callable[[int], bool]:
        """A channel opened on that transport is still on the one in use, and open."""


class LinkView(_Link, Protocol):
    """What of its connection's link a sync session's retries look at (its
    ``SessionContext``)."""

    @property
    def usable_transport(self) -> Callable[[], int]:
        """Return when the connection is open (wait while it recovers): the
        generation of the transport in use then, read with that check."""


def lost_since(link: _Link, started_on: int) -> bool:
    """True when the connection was lost since an attempt started on
    transport ``started_on`` (its generation), or is being lost.  Asked of
    that transport, not of the link now: by the time an attempt's error is
    seen, the recovery may be over and the link open again."""
    return not link.holds(started_on) or link.recovering_or_lost()


class SessionRetry:
    """Runs a session's broker operations again when a connection loss
    interrupted them.

    Whether an error came from a loss is asked of the transport the attempt
    started on (``lost_since``), not of the link now: by the time the error
    is seen the recovery may be over, the link open again.
    """

    def __init__(self, link: LinkView, lock: threading.RLock) -> None:
        self._link = link
        self._lock = lock  # the session's: a recovery's restore takes it

    def lost_since(self, started_on: int) -> bool:
        """See :func:`lost_since`."""
        return lost_since(self._link, started_on)

    def usable_transport(self) -> int:
        """Return when the connection is open: the generation of the transport
        in use then.  One answer, not a usability check followed by a read of
        the generation: a loss and reconnection in between would give that of
        a transport still being restored, whose channels ``holds`` accepts
        once the restore is over (it replaced them meanwhile).

        Raises:
            ConnectionLostError: recovery gave up.
            IllegalStateError: the connection was closed.
        """
        return self._link.usable_transport()

    def rpc(self, fn: Callable[[], R]) -> R:
        """Run a broker operation, riding out a connection recovery.

        Raises:
            ConnectionLostError: recovery gave up, or the connection kept failing.
            IllegalStateError: the connection was closed.
            JMSException: the broker refused.
        """
        return self._on_usable(lambda _started_on: fn())

    def _on_usable(self, fn: Callable[[int], R]) -> R:
        """``rpc``, telling ``fn`` the generation of the transport it starts on."""
        for _ in range(ATTEMPTS):
            started_on = self.usable_transport()
            try:
                return fn(started_on)
            except ConnectionLostError:
                if not self.lost_since(started_on):
                    raise
        raise ConnectionLostError("connection kept failing during the operation")

    def on_one_transport(
        self,
        open_channel: Callable[[], TransportChannel],
        take_in: Callable[[int, TransportChannel], bool],
        stale: Callable[[], None] | None = None,
    ) -> None:
        """Attach a new channel to a producer or consumer (a new one, or one
        that recover() or rollback() moves), on one transport.

        A recovery restores what the connection has registered (the loss
        detaches it) and the session holds (the restore re-opens its
        channels).  So ``take_in(opened_on, channel)`` runs under the session
        lock (the restore waits for it) and attaches the channel only if the
        transport it was opened on is still in use and open (a new one's: if
        the connection registers it there).  Else (False, leaving nothing
        behind) a loss came in between and the channel is stale: its recovery
        left a new one out, or gives a moved one a channel that the stale one
        must not replace; open another, once ``stale()`` removed what else
        ``open_channel`` left on the broker for it.

        Raises:
            ConnectionLostError: the connection kept failing.
        """
        for _ in range(ATTEMPTS):
            opened_on, channel = self._on_usable(lambda started_on: (started_on, open_channel()))
            with self._lock:
                if take_in(opened_on, channel):
                    return
            channel.detach()  # its late events must not reach the producer or consumer
            channel.close()
            if stale is not None:
                stale()
        raise ConnectionLostError("connection kept failing while creating a producer or consumer")
