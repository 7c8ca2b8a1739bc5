"""asyncio ConnectionFactory and Connection: the broker connection on the
application's loop, its recovery, connection-wide events and consumer flow."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import tenacity

from .. import _system
from .._connection import ExceptionListener
from .._connection_core import TransportEvents, carry_out, recovery_failed, retry_policy
from .._consumer_flow import (
    ConnectionFlow,
    ConsumerFlowStats,
    FlowAction,
)
from .._endpoints import Endpoints, all_failed, parse_urls, redact
from .._exceptions import ConnectionLostError, IllegalStateError, JMSException
from .._flow import GateEvent
from .._log import get_logger
from .._properties import ClientConfig, default_url
from .._recovery import Link, LinkEvent, LinkMachine
from .._session_core import AUTO_ACKNOWLEDGE
from .._tls import tls_context
from .._transport_base import ChannelHandler, TransportListener
from ._consumer import MessageConsumer
from ._producer import MessageProducer
from ._session import Session, SessionContext
from ._transport import AioChannel, AioTransport

__all__ = ["Connection", "ConnectionFactory"]

_log = get_logger()


class TransportFactory(Protocol):
    """Builds the transport of a connection (a fake one in unit tests)."""

    def __call__(
        self,
        url: str,
        listener: TransportListener,
        *,
        heartbeat: int,
        name: str,
        ssl_context: ssl.SSLContext | None,
    ) -> AioTransport:
        """A transport that is not yet connected."""
        ...


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
        _transport_factory: TransportFactory | None = None,
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


class Connection:
    """A connection to the broker on the running loop, recovered when lost.

    Created stopped (as in JMS): consumers receive nothing until ``start()``.
    ``async with`` closes it.  Any number of tasks of that loop may share it.
    """

    _names = iter(range(1, 1 << 62))

    def __init__(
        self,
        urls: Sequence[str],
        config: ClientConfig,
        transport_factory: TransportFactory,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._endpoints = Endpoints(urls)
        self.config = config
        self._loop = asyncio.get_running_loop()
        self.clock: Callable[[], float] = self._loop.time
        self._transport_factory = transport_factory
        self._ssl_context = ssl_context
        self._name = f"rabbitflow-aio-{next(self._names)}"
        self._link = LinkMachine()
        self._usable = asyncio.Event()
        self._usable.set()
        self._generation = 0
        self._current = 0
        self._error: JMSException | None = None
        self._started = False
        self._listener: ExceptionListener | None = None
        self._sessions: list[Session] = []
        self._producers: list[MessageProducer] = []
        self._consumers: dict[int, MessageConsumer] = {}
        self._blocked: str | None = None
        self._flow = ConnectionFlow(
            config.connection_flow_limit if config.connection_flow_limit_enabled else None
        )
        self._flow_timer: asyncio.TimerHandle | None = None
        self._flow_timer_at: float | None = None
        self._recovery: asyncio.Task[None] | None = None
        self.reconnect_count = 0
        self._transport: AioTransport

    async def _connect(self) -> None:
        """Connect to the first URL that answers, each tried once.

        Raises:
            JMSException: every URL failed (see ``all_failed``).
        """
        errors: list[tuple[str, JMSException]] = []
        for url in self._endpoints.one_round():
            transport, generation = self._new_transport(url)
            try:
                await transport.connect()
            except JMSException as exc:
                await transport.close()
                errors.append((url, exc))
                continue
            self._transport, self._current = transport, generation
            return
        raise all_failed(errors)

    def _new_transport(self, url: str) -> tuple[AioTransport, int]:
        self._generation += 1
        transport = self._transport_factory(
            url,
            TransportEvents(
                self._generation,
                blocked=self._on_blocked,
                unblocked=self._on_unblocked,
                lost=self._on_lost,
            ),
            heartbeat=self.config.heartbeat_s,
            name=self._name,
            ssl_context=self._ssl_context,
        )
        return transport, self._generation

    # ------------------------------------------------------------- public
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
        return self._blocked is not None

    @property
    def buffered_count(self) -> int:
        """Messages buffered for all consumers of this connection."""
        return self._flow.buffered

    def start(self) -> None:
        """Start (or resume) delivery to consumers."""
        self._check_not_closed()
        self._started = True
        if not self._flow.active:
            self._apply(self._flow.activate(now=self.clock()))
        for consumer in list(self._consumers.values()):
            consumer._wake()

    def stop(self) -> None:
        """Pause delivery to consumers (receive() waits)."""
        self._check_not_closed()
        self._started = False

    def create_session(self, acknowledge_mode: int = AUTO_ACKNOWLEDGE) -> Session:
        """A new session (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE or DUPS_OK_ACKNOWLEDGE).

        Raises:
            IllegalStateError: the connection is closed.
            InvalidPropertyError: unknown acknowledge_mode.
        """
        self._check_not_closed()
        session = Session(self._session_context(), acknowledge_mode)
        self._sessions.append(session)
        return session

    def _session_context(self) -> SessionContext:
        return SessionContext(
            connection=self,
            config=self.config,
            clock=self.clock,
            usable=self._is_usable,
            wait_usable=self._wait_usable,
            recovering_or_lost=self._recovering_or_lost,
            open_channel=self._open_channel,
            report=self._report,
            started=self._is_started,
            register_producer=self._register_producer,
            unregister_producer=self._unregister_producer,
            register_consumer=self._register_consumer,
            unregister_consumer=self._unregister_consumer,
            reset_consumer_flow=self._reset_consumer_flow,
            flow_stats=self._flow_stats,
            flow_delivered=self._flow_delivered,
            flow_processed=self._flow_processed,
            flow_acknowledged=self._flow_acknowledged,
            closed=self._session_closed,
        )

    def set_exception_listener(self, listener: ExceptionListener | None) -> None:
        """Call ``listener(error)`` when recovery gives up or the broker closes
        a channel of this connection (on the loop)."""
        self._listener = listener

    async def close(self) -> None:
        """Close sessions (producers wait for their confirms), then the connection.

        Raises:
            UnconfirmedMessagesError: a producer could not get its sends
                confirmed (the connection is closed anyway).
        """
        if self._link.state is Link.CLOSED:
            return
        errors: list[JMSException] = []
        for session in list(self._sessions):
            try:
                await session.close()
            except JMSException as exc:
                errors.append(exc)
        self._link.handle(LinkEvent.CLOSE)
        self._usable.set()
        if self._flow_timer is not None:
            self._flow_timer.cancel()
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
        return f"<aio.Connection {self._name} {self._link.state.value} started={self._started}>"

    # -------------------------------------------------- used by the layers
    def _check_not_closed(self) -> None:
        if self._link.state is Link.CLOSED:
            raise IllegalStateError("connection is closed")

    async def _wait_usable(self) -> None:
        while True:
            state = self._link.state
            if state is Link.OPEN:
                return
            if state is Link.CLOSED:
                raise IllegalStateError("connection is closed")
            if state is Link.FAILED:
                assert self._error is not None
                raise self._error
            self._usable.clear()
            await self._usable.wait()

    def _is_usable(self) -> bool:
        return self._link.usable

    def _is_started(self) -> bool:
        return self._started

    def _closed_meanwhile(self) -> bool:
        return self._link.closed

    def _recovering_or_lost(self) -> bool:
        return self._link.recovering or self._transport.lost

    async def _open_channel(self, handler: ChannelHandler) -> AioChannel:
        return await self._transport.open_channel(handler)

    def _report(self, error: JMSException) -> None:
        listener = self._listener
        if listener is not None:
            try:
                listener(error)
            except Exception:
                _log.exception("Exception listener raised")

    def _register_producer(self, producer: MessageProducer) -> None:
        self._producers.append(producer)
        if self._blocked is not None:
            producer._gate(GateEvent.BLOCKED, self._blocked)

    def _unregister_producer(self, producer: MessageProducer) -> None:
        if producer in self._producers:
            self._producers.remove(producer)

    def _session_closed(self, session: Session) -> None:
        if session in self._sessions:
            self._sessions.remove(session)

    # ------------------------------------------------------ consumer flow
    def _apply(self, actions: list[FlowAction]) -> None:
        """Carry out flow actions on the consumers' channels, in order, and
        arm the flow machine's timer when it asks for one."""
        self._arm_flow_timer()
        for action in actions:
            consumer = self._consumers.get(action.consumer)
            channel = consumer._channel if consumer is not None else None
            if consumer is None or channel is None or channel.closed:
                continue
            answer = functools.partial(self._flow_answer, consumer.id)
            carry_out(action, channel, consumer.queue_name, answer, answer)

    def _arm_flow_timer(self) -> None:
        wake = self._flow.wake_at()
        if wake is None or (self._flow_timer_at is not None and self._flow_timer_at <= wake):
            return
        if self._flow_timer is not None:
            self._flow_timer.cancel()
        self._flow_timer_at = wake
        self._flow_timer = self._loop.call_later(max(wake - self.clock(), 0.0), self._flow_tick)

    def _flow_tick(self) -> None:
        self._flow_timer_at = None
        self._flow_timer = None
        self._apply(self._flow.tick(self.clock()))

    def _flow_answer(self, consumer_id: int, depth: int | None = None) -> None:
        """The broker answered a consumer's ProbeQueue (``depth``) or lowering qos."""
        if consumer_id in self._consumers:
            if depth is None:
                self._apply(self._flow.prefetch_lowered(consumer_id, now=self.clock()))
            else:
                self._apply(self._flow.queue_depth(consumer_id, depth, now=self.clock()))

    def _register_consumer(self, consumer: MessageConsumer, app_acks: bool) -> None:
        self._consumers[consumer.id] = consumer
        self._apply(
            self._flow.register(
                consumer.id,
                limit=self.config.consumer_flow_limit,
                threshold_pct=self.config.consumer_flow_threshold,
                app_acks=app_acks,
                now=self.clock(),
            )
        )

    def _unregister_consumer(self, consumer: MessageConsumer) -> None:
        self._apply(self._flow.unregister(consumer.id, now=self.clock()))
        self._consumers.pop(consumer.id, None)

    def _reset_consumer_flow(self, consumer: MessageConsumer) -> None:
        if consumer.id in self._consumers:
            self._apply(self._flow.reset(consumer.id, now=self.clock()))

    def _flow_delivered(self, consumer_id: int) -> None:
        if consumer_id in self._consumers:
            self._flow.delivered(consumer_id, now=self.clock())

    def _flow_processed(self, consumer_id: int, tag: int) -> None:
        if consumer_id in self._consumers:
            self._apply(self._flow.processed(consumer_id, tag, now=self.clock()))

    def _flow_acknowledged(self, consumer_id: int) -> None:
        if consumer_id in self._consumers:
            self._apply(self._flow.acknowledged(consumer_id, now=self.clock()))

    def _flow_stats(self, consumer_id: int) -> ConsumerFlowStats:
        if consumer_id not in self._consumers:
            return ConsumerFlowStats(0, 0, 0, 0, 0, ())
        return self._flow.stats(consumer_id)

    # ------------------------------------------------- transport events
    def _on_blocked(self, generation: int, reason: str) -> None:
        if generation != self._current:
            return
        self._blocked = reason
        for producer in list(self._producers):
            producer._gate(GateEvent.BLOCKED, reason)

    def _on_unblocked(self, generation: int) -> None:
        if generation != self._current:
            return
        self._blocked = None
        for producer in list(self._producers):
            producer._gate(GateEvent.UNBLOCKED)

    def _on_lost(self, generation: int, error: ConnectionLostError) -> None:
        if generation != self._current:
            return
        step = self._link.handle(LinkEvent.LOST)
        if step.detach:
            self._detach_all()
        if step.start_recovery:
            _log.warning(
                "Connection lost, recovering",
                error=str(error),
                connection=self._name,
                url=redact(self.url),
            )
            self._recovery = self._loop.create_task(self._recover(error))
        elif step.detach:
            _log.warning(
                "Connection lost again during recovery", error=str(error), connection=self._name
            )

    def _detach_all(self) -> None:
        self._blocked = None
        for producer in list(self._producers):
            producer._lost()
        for consumer in list(self._consumers.values()):
            consumer._lost()

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
                    if self._link.closed:
                        return
                    await self._reconnect_once()
        except JMSException as exc:
            self._give_up(exc, attempts)
            return
        if self._link.closed:
            return
        self.reconnect_count += 1
        self._usable.set()
        _log.info(
            "Connection recovered",
            connection=self._name,
            attempts=attempts,
            url=redact(self.url),
        )

    async def _reconnect_once(self) -> None:
        if self._link.closed:
            return
        self._link.handle(LinkEvent.ATTEMPT)
        transport, generation = self._new_transport(self._endpoints.next())
        try:
            await transport.connect()
            if self._closed_meanwhile():
                await transport.close()
                return
            self._transport, self._current = transport, generation
            self._link.handle(LinkEvent.CONNECTED)
            for session in list(self._sessions):
                await session._restore()
            step = self._link.handle(LinkEvent.RESTORED)
            if step.new is not Link.OPEN:
                raise ConnectionLostError("the connection was lost again while it was restored")
        except JMSException:
            await transport.close()
            step = self._link.handle(LinkEvent.ATTEMPT_FAILED)
            if step.detach:
                self._detach_all()
            raise

    def _give_up(self, cause: JMSException, attempts: int) -> None:
        error = recovery_failed(self.urls, attempts, cause)
        if self._link.state is Link.CLOSED:
            return
        self._link.handle(LinkEvent.GIVE_UP)
        self._error = error
        self._usable.set()
        _log.error("Connection recovery gave up", error=str(error), connection=self._name)
        for producer in list(self._producers):
            producer._fail(error)
        for consumer in list(self._consumers.values()):
            consumer._fail(error)
        self._report(error)
