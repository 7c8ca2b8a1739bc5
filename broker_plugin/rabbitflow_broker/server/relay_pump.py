"""The hot path of a relayed connection: a read in, the engine's actions out.

:class:`Pump` is the part of the asyncio driver (:mod:`~rabbitflow_broker.server.relay`)
that runs for every read: it hands the bytes to the
:class:`~rabbitflow_broker.engine.connection.Engine` with the clock and carries out the
:class:`~rabbitflow_broker.engine.ports.Actions` that come back (one write per
side, events to the gateway's sink), and tells the read-pause policy
(:class:`~rabbitflow_broker.server.read_pause.ReadPause`) about client reads.  What
happens rarely (pausing the client, the timer, closing) it passes to its
:class:`Owner`, the relay.  It is compiled with the engine
(:mod:`~rabbitflow_broker.accel`), so a read costs no interpreted Python
between the event loop and the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from rabbitflow_broker.engine.connection import Engine
from rabbitflow_broker.engine.ports import Actions, Chunk
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.read_pause import OFF, Loop, ReadPause

__all__ = ["Owner", "Pump", "Transport"]


class Transport(Protocol):
    """What the pump needs of a socket transport."""

    def write(self, data: Chunk) -> None: ...

    def writelines(self, list_of_data: Iterable[Chunk]) -> None: ...

    def is_closing(self) -> bool: ...


class Owner(Protocol):
    """The driver that owns the sockets, the timer and the lifecycle."""

    def abort(self) -> None:
        """Close both sockets (after flushing what was written)."""

    def read_client(self, reading: bool) -> None:
        """The engine wants the client read (True) or not (False)."""

    def set_timer(self, deadline: float | None) -> None:
        """Call :meth:`Pump.tick` at monotonic time ``deadline`` (None: never)."""


class _NoOwner:
    """The owner of a released pump: nothing left to drive."""

    def abort(self) -> None:
        return None

    def read_client(self, reading: bool) -> None:
        return None

    def set_timer(self, deadline: float | None) -> None:
        return None


_NO_OWNER: Owner = _NoOwner()


class Pump:
    """Feeds one connection's reads to its engine and carries out the actions."""

    def __init__(
        self, engine: Engine, gateway: Gateway, owner: Owner, read_pause: ReadPause = OFF
    ) -> None:
        self.engine = engine
        #: What the loop does after a turn with client reads (shared by all connections).
        self.read_pause = read_pause
        self.gateway = gateway
        # The owner (the relay) holds the pump too: release() breaks that
        # cycle when the connection ends.
        self.owner = owner
        self.client: Transport | None = None
        self.upstream: Transport | None = None
        #: The event loop (for the read pause); set when connected.
        self.loop: Loop | None = None
        #: Set once the relay closes: reads are then ignored.
        self.closing = False
        self._reading = True  # what the engine last asked for the client
        self._deadline: float | None = None  # the timer last asked for

    def release(self) -> None:
        """The connection ended: let go of the owner, the sockets and the loop,
        so that reference counting frees the connection at once."""
        self.closing = True
        self.owner = _NO_OWNER
        self.client = self.upstream = None
        self.loop = None

    def client_data(self, data: bytes) -> None:
        """Bytes from the client."""
        if not self.closing:
            engine = self.engine
            self.perform(engine.receive_client(data, self.gateway.monotonic()))
            self.read_pause.after_read(self.loop, engine.outstanding)

    def upstream_data(self, data: bytes) -> None:
        """Bytes from RabbitMQ."""
        if not self.closing:
            self.perform(self.engine.receive_upstream(data, self.gateway.monotonic()))

    def tick(self) -> None:
        """The timer fired."""
        self._deadline = None
        if not self.closing:
            self.perform(self.engine.tick(self.gateway.monotonic()))

    def perform(self, actions: Actions) -> None:
        """Carry out ``actions`` in their order: writes, events, close, reading, timer."""
        if actions.to_upstream:
            _send(self.upstream, actions.to_upstream)
        if actions.to_client:
            _send(self.client, actions.to_client)
        if actions.events:
            gateway = self.gateway
            for event in actions.events:
                gateway.emit(event)
        if actions.close:
            self.owner.abort()
            return
        if actions.read_client != self._reading:
            self._reading = actions.read_client
            self.owner.read_client(actions.read_client)
        if actions.timer != self._deadline:
            self._deadline = actions.timer
            self.owner.set_timer(actions.timer)


def _send(transport: Transport | None, parts: list[Chunk]) -> None:
    """Write ``parts`` to ``transport`` unless it is gone or closing.  Several
    chunks go in one ``writelines``: uvloop sends them with one ``writev``,
    without joining (copying) them first."""
    if transport is not None and not transport.is_closing():
        if len(parts) == 1:
            transport.write(parts[0])
        else:
            transport.writelines(parts)
