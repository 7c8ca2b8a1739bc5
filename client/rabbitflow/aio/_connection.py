"""asyncio ConnectionFactory and Connection: the broker connection on the
application's loop, and its recovery in a task.  What it owns apart from
driving them is shared with the sync SDK: ``_connection_core`` (its
producers, its consumers' flow accounting) and ``_recovery`` (its link and
transports)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import tenacity

from .. import _system
from .._connection_base import ConnectionBase, TransportFactory, Transports
from .._connection_core import (
    ConsumerFlowBook,
    ExceptionListener,
    ProducerBook,
    detach,
    fail,
    log_lost,
    log_recovered,
    recovery_failed,
    report,
    retry_policy,
)
from .._endpoints import Endpoints, all_failed, parse_urls, redact
from .._exceptions import ConnectionLostError, JMSException
from .._flow import GateEvent
from .._producer_core import ProducerControl
from .._properties import ClientConfig, default_url
from .._recovery import LinkState
from .._session_core import AUTO_ACKNOWLEDGE, ConsumerControl
from .._tls import tls_context
from .._transport_base import ChannelHandler, TransportListener
from ._session import Session, SessionContext, open_session
from ._transport import AioChannel, AioTransport

__all__ = ["Connection", "ConnectionFactory"]


def _aio_transport(
    url: str,
    listener: TransportListener,
    *,
    heartbeat: int,
    name: str,
    ssl_context: ssl.SSLContext | None,
) -> AioTransport:
    return AioTransport(url, listener, heartbeat=heartbeat, name=name, ssl_context=ssl_context)


def reconnect_strategy(config: ClientConfig) -> tenacity.AsyncRetrying:
    """The sync SDK's reconnection policy (same properties), for asyncio."""
    return tenacity.AsyncRetrying(**retry_policy(config))


class ConnectionFactory:
    """Creates asyncio connections with one validated configuration.

    Same arguments and properties as ``rabbitflow.ConnectionFactory``,
    several URLs (or ``failover:(url,url)``) included.
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        properties: Mapping[str, Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        _transport_factory: TransportFactory[AioTransport] | None = None,
    ) -> None:
        """Validate the configuration.

        Raises:
            InvalidPropertyError: a property value is bad, or the URLs are
                malformed, empty or mix amqp:// with amqps:// (also a ValueError).
        """
        #: Every broker URL, in the order they are tried; ``url`` is the first.
        self.urls = parse_urls(default_url() if url is None or url == "" else url)
        self.url = self.urls[0]
        self.config = ClientConfig.resolve(
            _system.environment_properties(), _system.explicit_system_properties(), properties
        )
        self.ssl_context = tls_context(self.url, self.config, ssl_context)
        self._transport_factory = _transport_factory or _aio_transport

    async def create_connection(self) -> Connection:
        """Connect to the broker (the first of its URLs that answers, on the running loop).

        Raises:
            ConnectionLostError: no broker URL can be reached (also a ConnectionError).
            BrokerError: authentication or access refused, bad URL.
            TLSError: the broker's TLS certificate is not trusted.
        """
        connection = Connection(self.urls, self.config, self._transport_factory, self.ssl_context)
        await connection._connect()
        return connection

    def __repr__(self) -> str:
        urls = ",".join(redact(u) for u in self.urls)
        return f"aio.ConnectionFactory({urls!r}, config={self.config!r})"


class Connection(ConnectionBase):
    """A connection to the broker on the running loop, recovered when lost.

    Created stopped (as in JMS): consumers receive nothing until ``start()``.
    ``async with`` closes it.  Any number of tasks of that loop may share it.
    """

    _names = iter(range(1, 1 << 62))

    def __init__(
        self,
        urls: Sequence[str],
        config: ClientConfig,
        transport_factory: TransportFactory[AioTransport],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._endpoints = Endpoints(urls)
        self.config = config
        self._loop = asyncio.get_running_loop()
        self.clock: Callable[[], float] = self._loop.time
        self._name = f"rabbitflow-aio-{next(self._names)}"
        self._state = LinkState()
        self._transports = Transports(
            transport_factory,
            config,
            self._name,
            ssl_context,
            self._state,
            blocked=self._on_blocked,
            unblocked=self._on_unblocked,
            lost=self._on_lost,
        )
        self._usable = asyncio.Event()
        self._usable.set()
        self._started = False
        self._listener: ExceptionListener | None = None
        self._sessions: dict[Session, Callable[[], Awaitable[None]]] = {}  # -> its restore
        self._producers = ProducerBook()
        # One loop: the book needs no lock, and its actions run at once.
        self._flow = ConsumerFlowBook(
            config,
            self.clock,
            lock=contextlib.nullcontext(),
            execute=lambda run: run(),
            arm=self._loop.call_later,
        )
        self._recovery: asyncio.Task[None] | None = None
        self._transport: AioTransport

    async def _connect(self) -> None:
        """Connect to the first URL that answers, each tried once.

        Raises:
            JMSException: every URL failed (see ``all_failed``).
        """
        errors: list[tuple[str, JMSException]] = []
        for url in self._endpoints.one_round():
            transport, generation = self._transports.new(url)
            try:
                await transport.connect()
            except JMSException as exc:
                await transport.close()
                errors.append((url, exc))
                continue
            self._transport = transport
            self._state.use(generation)
            self._block_early()
            return
        raise all_failed(errors)

    # ------------------------------------------------------------- public
    def create_session(self, acknowledge_mode: int = AUTO_ACKNOWLEDGE) -> Session:
        """A new session (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE or DUPS_OK_ACKNOWLEDGE).

        Raises:
            IllegalStateError: the connection is closed.
            InvalidPropertyError: unknown acknowledge_mode.
        """
        self._state.check_open()
        session, restore = open_session(self._session_context(), acknowledge_mode)
        self._sessions[session] = restore
        return session

    def _session_context(self) -> SessionContext:
        return SessionContext(
            connection=self,
            config=self.config,
            clock=self.clock,
            usable=lambda: self._state.usable,
            wait_usable=self._wait_usable,
            recovering_or_lost=self._recovering_or_lost,
            transport_in_use=lambda: self._state.in_use,
            holds=self._state.holds,
            open_channel=self._open_channel,
            report=self._report,
            started=lambda: self._started,
            register_producer=self._register_producer,
            unregister_producer=self._producers.remove,
            register_consumer=self._register_consumer,
            flow=self._flow,
            closed=self._session_closed,
        )

    async def close(self) -> None:
        """Close sessions (producers wait for their confirms), then the connection.

        Raises:
            UnconfirmedMessagesError: a producer could not get its sends
                confirmed (the connection is closed anyway).
        """
        if self._state.closed:
            return
        errors: list[JMSException] = []
        for session in list(self._sessions):
            try:
                await session.close()
            except JMSException as exc:
                errors.append(exc)
        self._state.close()
        self._usable.set()
        self._flow.close()
        recovery = self._recovery
        if recovery is not None and not recovery.done():
            recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, JMSException):
                await recovery
        await self._transport.close()
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio.Connection {self._name} {self._state.state.value} started={self._started}>"

    # -------------------------------------------------- used by the layers
    async def _wait_usable(self) -> None:
        while not self._state.check_usable():
            self._usable.clear()
            await self._usable.wait()

    def _recovering_or_lost(self) -> bool:
        return self._state.recovering or self._transport.lost

    def _report(self, error: JMSException) -> None:
        report(self._listener, error)

    async def _open_channel(self, handler: ChannelHandler) -> AioChannel:
        return await self._transport.open_channel(handler)

    def _register_producer(self, producer: ProducerControl[AioChannel], opened_on: int) -> bool:
        """Register a new producer whose channel was opened on transport
        ``opened_on``; False, registering nothing, when that transport is no
        longer in use or the link is not open: a loss came while the channel
        was opened, and its recovery left the producer out (the caller opens
        another channel)."""
        if not self._state.holds(opened_on):
            return False
        blocked = self._producers.add(producer)
        if blocked is not None:
            producer.gate(GateEvent.BLOCKED, blocked)
        return True

    def _register_consumer(
        self, consumer: ConsumerControl[AioChannel], app_acks: bool, opened_on: int
    ) -> bool:
        """Register a new consumer whose channel was opened on transport
        ``opened_on`` with the flow accounting (which starts it consuming);
        False, registering nothing, as for a producer."""
        if not self._state.holds(opened_on):
            return False
        self._flow.register(consumer, app_acks)
        return True

    def _session_closed(self, session: Session) -> None:
        self._sessions.pop(session, None)

    # ------------------------------------------------- transport events
    def _on_blocked(self, generation: int, reason: str) -> None:
        # Kept if the transport is being opened: see _block_early.
        if self._state.block_applies(generation, reason):
            for producer in self._producers.block(reason):
                producer.gate(GateEvent.BLOCKED, reason)

    def _on_unblocked(self, generation: int) -> None:
        if self._state.block_applies(generation, None):
            for producer in self._producers.unblock():
                producer.gate(GateEvent.UNBLOCKED, "")

    def _block_early(self) -> None:
        """Once a transport is put in use, before anything is restored on it:
        block the connection if the broker blocked that transport while it
        was being opened (producers come back blocked)."""
        reason = self._state.blocked_early()
        if reason is not None:
            for producer in self._producers.block(reason):
                producer.gate(GateEvent.BLOCKED, reason)

    def _on_lost(self, generation: int, error: ConnectionLostError) -> None:
        step = self._state.lost(generation)
        if step is None:
            return  # a transport already replaced (or a failed attempt's)
        if step.detach:
            detach(self._producers.unblock(), self._flow.consumers())
        log_lost(step, error, self._name, self.url)
        if step.start_recovery:
            self._recovery = self._loop.create_task(self._recover(error))

    # ------------------------------------------------------------ recovery
    async def _recover(self, error: ConnectionLostError) -> None:
        if self.config.reconnect_attempts == 0:
            self._give_up(error, 0)
            return
        attempts = 0
        try:
            async for attempt in reconnect_strategy(self.config):
                with attempt:
                    attempts += 1
                    if self._state.closed:
                        return
                    await self._reconnect_once()
        except JMSException as exc:
            self._give_up(exc, attempts)
            return
        if self._state.recovered():
            self._usable.set()
            log_recovered(self._name, attempts, self.url)

    async def _reconnect_once(self) -> None:
        if not self._state.attempt():
            return
        transport, generation = self._transports.new(self._endpoints.next())
        try:
            await transport.connect()
            if not self._state.connected(generation):  # closed meanwhile
                await transport.close()
                return
            self._transport = transport
            self._block_early()
            for restore in list(self._sessions.values()):
                await restore()
            self._state.restored()
        except JMSException:
            await transport.close()
            if self._state.attempt_failed():
                detach(self._producers.unblock(), self._flow.consumers())
            raise

    def _give_up(self, cause: JMSException, attempts: int) -> None:
        error = recovery_failed(self.urls, attempts, cause)
        if self._state.give_up(error):
            self._usable.set()
            fail(error, self._name, self._producers.all(), self._flow.consumers())
            self._report(error)
