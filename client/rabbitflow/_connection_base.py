"""What the sync and the asyncio Connection hold alike, and how they read
it: the URLs (rotated by recovery), the link state, the producers, the
consumers' flow, the exception listener; and how they build transports.
Each driver's ``Connection`` sets these in its ``__init__`` and adds how it
waits, locks and recovers."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ._connection_core import (
    ConsumerFlowBook,
    ExceptionListener,
    ProducerBook,
    TransportEvents,
)
from ._endpoints import Endpoints
from ._exceptions import ConnectionLostError
from ._properties import ClientConfig
from ._recovery import LinkState
from ._transport_base import TransportListener

__all__ = ["ConnectionBase", "TransportFactory", "Transports"]

TransportT = TypeVar("TransportT")
TransportT_co = TypeVar("TransportT_co", covariant=True)


class TransportFactory(Protocol[TransportT_co]):
    """Builds the transport of a connection (a fake one in unit tests)."""

    def __call__(
        self,
        url: str,
        listener: TransportListener,
        *,
        heartbeat: int,
        name: str,
        ssl_context: ssl.SSLContext | None,
    ) -> TransportT_co:
        """A transport that is not yet connected."""
        ...


class Transports(Generic[TransportT]):
    """Builds a connection's transports: each with the connection's name,
    heartbeat and TLS context, its events tagged with a new generation (so
    that the connection ignores those of a transport it replaced)."""

    def __init__(
        self,
        factory: TransportFactory[TransportT],
        config: ClientConfig,
        name: str,
        ssl_context: ssl.SSLContext | None,
        state: LinkState,
        *,
        blocked: Callable[[int, str], None],
        unblocked: Callable[[int], None],
        lost: Callable[[int, ConnectionLostError], None],
    ) -> None:
        self._factory = factory
        self._heartbeat = config.heartbeat_s
        self._name = name
        self._ssl_context = ssl_context
        self._state = state
        self._events = (blocked, unblocked, lost)

    def new(self, url: str) -> tuple[TransportT, int]:
        """A transport to ``url``, not yet connected, and its generation."""
        generation = self._state.new_transport()
        blocked, unblocked, lost = self._events
        transport = self._factory(
            url,
            TransportEvents(generation, blocked=blocked, unblocked=unblocked, lost=lost),
            heartbeat=self._heartbeat,
            name=self._name,
            ssl_context=self._ssl_context,
        )
        return transport, generation


class ConnectionBase:
    """The part of a Connection both drivers share (see the module)."""

    _endpoints: Endpoints
    _state: LinkState
    _started: bool
    _listener: ExceptionListener | None
    _producers: ProducerBook
    _flow: ConsumerFlowBook

    @property
    def url(self) -> str:
        """The broker URL in use (or last tried, while recovering)."""
        return self._endpoints.current

    @property
    def urls(self) -> tuple[str, ...]:
        """Every broker URL, in the order they are tried."""
        return self._endpoints.urls

    @property
    def started(self) -> bool:
        """True between start() and stop()."""
        return self._started

    @property
    def is_blocked(self) -> bool:
        """True while the broker has blocked the connection (resource alarm)."""
        return self._producers.blocked is not None

    @property
    def buffered_count(self) -> int:
        """Messages buffered for all consumers of this connection."""
        return self._flow.buffered

    @property
    def reconnect_count(self) -> int:
        """How often the connection was recovered."""
        return self._state.reconnect_count

    def start(self) -> None:
        """Start (or resume) delivery to consumers.

        Raises:
            IllegalStateError: the connection is closed.
        """
        self._state.check_open()
        self._started = True
        self._flow.activate()
        for consumer in self._flow.consumers():
            consumer.wake()

    def stop(self) -> None:
        """Pause delivery to consumers (receives wait, listeners idle).

        Raises:
            IllegalStateError: the connection is closed.
        """
        self._state.check_open()
        self._started = False

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        """Call ``listener(error)`` when recovery gives up or the broker closes
        a channel of this connection (from an internal thread; on the loop
        for asyncio)."""
        self._listener = listener
