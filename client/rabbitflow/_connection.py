"""ConnectionFactory and Connection: the broker connection, its recovery,
connection-wide events (blocked / lost) and consumer flow accounting."""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import tenacity

from . import _system
from ._connection_core import TransportEvents, carry_out, recovery_failed, retry_policy
from ._consumer import MessageConsumer
from ._consumer_flow import (
    ConnectionFlow,
    ConsumerFlowStats,
    FlowAction,
)
from ._endpoints import Endpoints, all_failed, parse_urls, redact
from ._exceptions import ConnectionLostError, IllegalStateError, JMSException
from ._flow import GateEvent
from ._log import get_logger
from ._producer import MessageProducer
from ._properties import ClientConfig, default_url
from ._recovery import Link, LinkEvent, LinkMachine
from ._session import Session, SessionContext
from ._session_core import AUTO_ACKNOWLEDGE
from ._tls import tls_context
from ._transport import ChannelHandler, PikaTransport, TransportChannel, TransportListener

__all__ = ["Connection", "ConnectionFactory", "ExceptionListener", "connect_first"]

R = TypeVar("R")

_log = get_logger()
ExceptionListener = Callable[[JMSException], None]
Waiter = Callable[[threading.Condition, float], None]


def _condition_wait(condition: threading.Condition, timeout: float) -> None:
    condition.wait(timeout)


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
    ) -> PikaTransport:
        """A transport that is not yet connected."""
        ...


def _pika_transport(
    url: str,
    listener: TransportListener,
    *,
    heartbeat: int,
    name: str,
    ssl_context: ssl.SSLContext | None,
) -> PikaTransport:
    return PikaTransport(url, listener, heartbeat=heartbeat, name=name, ssl_context=ssl_context)


def reconnect_strategy(
    config: ClientConfig, *, sleep: Callable[[float], None] = time.sleep
) -> tenacity.Retrying:
    """The reconnection retry policy, built from configuration (one place).

    Up to ``rabbitflow.reconnect_attempts`` attempts within
    ``rabbitflow.reconnect_timeout`` ms, exponential backoff with jitter from
    ``rabbitflow.reconnect_initial_delay`` to ``rabbitflow.reconnect_max_delay``.
    """
    return tenacity.Retrying(sleep=sleep, **retry_policy(config))


class ConnectionFactory:
    """Creates connections to a broker (or one of several gateways) with one
    validated configuration.

    ``url`` defaults to ``$RABBITFLOW_URL``, else
    ``amqp://guest:guest@localhost:5672/%2F``.  Several URLs (a list, a
    string with commas, or ``failover:(url,url)``) are tried in order when
    connecting, and round robin by every recovery attempt.  ``properties`` override
    ``rabbitflow.system_properties``, which override ``RABBITFLOW_OPTS``,
    which override the defaults.  An ``amqps://`` URL connects with TLS:
    ``ssl_context`` when given, else a context built from the
    ``rabbitflow.ssl.ca_file`` / ``cert_file`` / ``key_file`` properties
    (the system's CAs when none is set).
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        properties: Mapping[str, Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        _transport_factory: TransportFactory | None = None,
        _sleep: Callable[[float], None] = time.sleep,
        _clock: Callable[[], float] = time.monotonic,
        _wait: Waiter | None = None,
    ) -> None:
        """Validate the configuration.

        Raises:
            InvalidPropertyError: a property value is bad, a CA, certificate or
                key file cannot be loaded, TLS settings come with an
                ``amqp://`` URL, or the URLs are malformed, empty or mix
                ``amqp://`` with ``amqps://`` (the text names the item).
        """
        #: Every broker URL, in the order they are tried; ``url`` is the first.
        self.urls = parse_urls(default_url() if url is None or url == "" else url)
        self.url = self.urls[0]
        self.config = ClientConfig.resolve(
            _system.environment_properties(), _system.explicit_system_properties(), properties
        )
        self.ssl_context = tls_context(self.url, self.config, ssl_context)
        # Test seams: a fake transport, clock, sleep (recovery) and condition wait.
        self._transport_factory = _transport_factory or _pika_transport
        self._sleep = _sleep
        self._clock = _clock
        self._wait = _wait or _condition_wait

    def create_connection(self) -> Connection:
        """Connect to the broker (the first of its URLs that answers).

        Raises:
            ConnectionLostError: no broker URL can be reached.
            BrokerError: authentication or access refused, bad URL.
            TLSError: the broker's TLS certificate is not trusted.
        """
        return Connection(
            self.urls,
            self.config,
            self._transport_factory,
            self._sleep,
            clock=self._clock,
            wait=self._wait,
            ssl_context=self.ssl_context,
        )

    def __repr__(self) -> str:
        urls = ",".join(redact(u) for u in self.urls)
        return f"ConnectionFactory({urls!r}, config={self.config!r})"


def connect_first(endpoints: Endpoints, connect: Callable[[str], R]) -> R:
    """``connect(url)`` for each URL in turn until one succeeds (the initial
    connect: no backoff, each URL once).

    Raises:
        JMSException: every URL failed: the error of the only URL, else a
            ConnectionLostError naming each URL's failure (an authentication
            or TLS failure is raised as it is, as retrying will not help).
    """
    errors: list[tuple[str, JMSException]] = []
    for url in endpoints.one_round():
        try:
            return connect(url)
        except JMSException as exc:
            errors.append((url, exc))
    raise all_failed(errors)


class Connection:
    """A connection to the broker, recovered automatically when lost.

    Created stopped (as in JMS): consumers receive nothing until ``start()``.
    Use as a context manager to close it.  Thread-safe.
    """

    _names = iter(range(1, 1 << 62))

    def __init__(
        self,
        urls: Sequence[str],
        config: ClientConfig,
        transport_factory: TransportFactory,
        sleep: Callable[[float], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Waiter | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._endpoints = Endpoints(urls)
        self._ssl_context = ssl_context
        self.clock = clock
        self.wait = wait or _condition_wait
        self.config = config
        self._transport_factory = transport_factory
        self._sleep = sleep
        self._name = f"rabbitflow-{next(self._names)}"
        self._cond = threading.Condition(threading.RLock())
        self._link = LinkMachine()
        self._generation = 0  # of the newest transport
        self._current = 0  # generation of self._transport
        self._error: JMSException | None = None
        self._started = False
        self._listener: ExceptionListener | None = None
        self._sessions: list[Session] = []
        self._producers: list[MessageProducer] = []
        # ids of producers whose pump is posted and has not run yet (set.add
        # and set.discard are atomic: no lock on the send path)
        self._pumps_pending: set[int] = set()
        self._consumers: dict[int, MessageConsumer] = {}
        self._blocked: str | None = None
        self._flow_lock = threading.Lock()
        self._flow = ConnectionFlow(
            config.connection_flow_limit if config.connection_flow_limit_enabled else None
        )
        self._flow_timer_at: float | None = None
        self.reconnect_count = 0
        self._recovery_thread: threading.Thread | None = None
        self._transport, self._current = connect_first(self._endpoints, self._connected_transport)

    def _connected_transport(self, url: str) -> tuple[PikaTransport, int]:
        transport, generation = self._new_transport(url)
        try:
            transport.connect()
        except JMSException:
            transport.close()
            raise
        return transport, generation

    def _new_transport(self, url: str) -> tuple[PikaTransport, int]:
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
        with self._flow_lock:
            return self._flow.buffered

    def start(self) -> None:
        """Start (or resume) delivery to consumers.

        Raises:
            IllegalStateError: the connection is closed.
        """
        self._check_not_closed()
        self._started = True
        with self._flow_lock:
            if not self._flow.active:
                self._apply(self._flow.activate(now=self.clock()))
        for consumer in list(self._consumers.values()):
            consumer._wake()

    def stop(self) -> None:
        """Pause delivery to consumers (receive() waits, listeners idle).

        Raises:
            IllegalStateError: the connection is closed.
        """
        self._check_not_closed()
        self._started = False

    def create_session(
        self, transacted: bool = False, acknowledge_mode: int = AUTO_ACKNOWLEDGE
    ) -> Session:
        """A new session.

        Raises:
            IllegalStateError: the connection is closed.
            InvalidPropertyError: unknown acknowledge_mode.
        """
        self._check_not_closed()
        session = Session(self._session_context(), transacted, acknowledge_mode)
        with self._cond:
            self._sessions.append(session)
        return session

    def _session_context(self) -> SessionContext:
        return SessionContext(
            connection=self,
            config=self.config,
            clock=self.clock,
            wait=self.wait,
            pumps_pending=self._pumps_pending,
            wait_usable=self._wait_usable,
            recovering_or_lost=self._recovering_or_lost,
            open_channel=self._open_channel,
            post=self._post,
            call_later=self._call_later,
            report=self._report,
            started=lambda: self._started,
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
        a channel of this connection (from an internal thread)."""
        self._listener = listener

    def get_exception_listener(self) -> ExceptionListener | None:
        """The exception listener."""
        return self._listener

    def close(self) -> None:
        """Close sessions (producers wait for their confirms), then the connection.

        Idempotent.

        Raises:
            JMSException: a producer could not get its sends confirmed (the
                connection is closed anyway).
        """
        with self._cond:
            if self._link.state is Link.CLOSED:
                return
            sessions = list(self._sessions)
        errors: list[JMSException] = []
        for session in sessions:
            try:
                session.close()
            except JMSException as exc:
                errors.append(exc)
        with self._cond:
            self._link.handle(LinkEvent.CLOSE)
            self._cond.notify_all()
        self._transport.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Connection {self._name} {self._link.state.value} started={self._started}>"

    # -------------------------------------------------- used by the layers
    def _check_not_closed(self) -> None:
        if self._link.state is Link.CLOSED:
            raise IllegalStateError("connection is closed")

    def _wait_usable(self) -> None:
        """Return when the connection is open; wait while it recovers.

        Raises:
            IllegalStateError: closed.
            ConnectionLostError: recovery gave up.
        """
        if self._link.usable:
            return  # the common case, without the lock
        with self._cond:
            while True:
                state = self._link.state
                if state is Link.OPEN:
                    return
                if state is Link.CLOSED:
                    raise IllegalStateError("connection is closed")
                if state is Link.FAILED:
                    assert self._error is not None
                    raise self._error
                self._cond.wait(0.5)

    def _recovering_or_lost(self) -> bool:
        return self._link.recovering or self._transport.lost

    def _open_channel(self, handler: ChannelHandler) -> TransportChannel:
        return self._transport.open_channel(handler)

    def _post(self, fn: Callable[[], None]) -> None:
        self._transport.post(fn)

    def _call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self._transport.call_later(delay, fn)

    def _report(self, error: JMSException) -> None:
        listener = self._listener
        if listener is not None:
            try:
                listener(error)
            except Exception:
                _log.exception("Exception listener raised")

    def _register_producer(self, producer: MessageProducer) -> None:
        with self._cond:
            self._producers.append(producer)
            blocked = self._blocked
        if blocked is not None:
            producer._gate(GateEvent.BLOCKED, blocked)

    def _unregister_producer(self, producer: MessageProducer) -> None:
        with self._cond:
            if producer in self._producers:
                self._producers.remove(producer)

    def _session_closed(self, session: Session) -> None:
        with self._cond:
            if session in self._sessions:
                self._sessions.remove(session)

    # ------------------------------------------------------ consumer flow
    def _apply(self, actions: list[FlowAction]) -> None:
        """Carry out flow actions on the I/O thread (call holding _flow_lock,
        so actions reach the broker in the order they were decided), and arm
        the flow machine's timer when it asks for one."""
        self._arm_flow_timer()
        if not actions:
            return
        targets = [(action, self._consumers.get(action.consumer)) for action in actions]
        bound = [(a, c, c._channel) for a, c in targets if c is not None and c._channel is not None]

        def run() -> None:
            for action, consumer, channel in bound:
                if consumer._channel is not channel or channel.closed:
                    continue  # the channel was replaced (recovery): tags are stale
                answer = functools.partial(self._flow_answer, consumer.id)
                carry_out(action, channel, consumer.queue_name, answer, answer)

        self._transport.post(run)

    def _arm_flow_timer(self) -> None:
        """Schedule ``_flow_tick`` at the flow machine's ``wake_at`` (holding _flow_lock)."""
        wake = self._flow.wake_at()
        if wake is None or (self._flow_timer_at is not None and self._flow_timer_at <= wake):
            return
        self._flow_timer_at = wake
        delay = max(wake - self.clock(), 0.0)
        transport = self._transport
        self._transport.post(lambda: transport.call_later(delay, self._flow_tick))

    def _flow_tick(self) -> None:
        with self._flow_lock:
            self._flow_timer_at = None
            self._apply(self._flow.tick(self.clock()))

    def _flow_answer(self, consumer_id: int, depth: int | None = None) -> None:
        """The broker answered a consumer's ProbeQueue (``depth``) or lowering qos."""
        with self._flow_lock:
            if consumer_id in self._consumers:
                if depth is None:
                    self._apply(self._flow.prefetch_lowered(consumer_id, now=self.clock()))
                else:
                    self._apply(self._flow.queue_depth(consumer_id, depth, now=self.clock()))

    def _register_consumer(self, consumer: MessageConsumer, app_acks: bool) -> None:
        with self._flow_lock:
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
        with self._flow_lock:
            self._apply(self._flow.unregister(consumer.id, now=self.clock()))
            self._consumers.pop(consumer.id, None)

    def _reset_consumer_flow(self, consumer: MessageConsumer) -> None:
        with self._flow_lock:
            if consumer.id in self._consumers:
                self._apply(self._flow.reset(consumer.id, now=self.clock()))

    # A consumer closed meanwhile (e.g. while its listener ran) is ignored:
    # closing its channel returned its unacked messages to the queue.
    def _flow_delivered(self, consumer_id: int) -> None:
        with self._flow_lock:
            if consumer_id in self._consumers:
                self._flow.delivered(consumer_id, now=self.clock())

    def _flow_processed(self, consumer_id: int, tag: int) -> None:
        with self._flow_lock:
            if consumer_id in self._consumers:
                self._apply(self._flow.processed(consumer_id, tag, now=self.clock()))

    def _flow_acknowledged(self, consumer_id: int) -> None:
        with self._flow_lock:
            if consumer_id in self._consumers:
                self._apply(self._flow.acknowledged(consumer_id, now=self.clock()))

    def _flow_stats(self, consumer_id: int) -> ConsumerFlowStats:
        with self._flow_lock:
            if consumer_id not in self._consumers:
                return ConsumerFlowStats(0, 0, 0, 0, 0, ())
            return self._flow.stats(consumer_id)

    # ----------------------------------------- transport events (I/O thread)
    def _on_blocked(self, generation: int, reason: str) -> None:
        """connection.blocked: every producer waits."""
        with self._cond:
            if generation != self._current:
                return
            self._blocked = reason
            producers = list(self._producers)
        for producer in producers:
            producer._gate(GateEvent.BLOCKED, reason)

    def _on_unblocked(self, generation: int) -> None:
        """connection.unblocked: producers resume."""
        with self._cond:
            if generation != self._current:
                return
            self._blocked = None
            producers = list(self._producers)
        for producer in producers:
            producer._gate(GateEvent.UNBLOCKED)

    def _on_lost(self, generation: int, error: ConnectionLostError) -> None:
        """The current transport died (also during recovery): every producer and
        consumer is disconnected at once; recovery starts or tries again."""
        with self._cond:
            if generation != self._current:
                return  # a transport already replaced (or a failed attempt's)
            step = self._link.handle(LinkEvent.LOST)
            self._cond.notify_all()
        if step.detach:
            self._detach_all()
        if step.start_recovery:
            _log.warning(
                "Connection lost, recovering",
                error=str(error),
                connection=self._name,
                url=redact(self.url),
            )
            self._recovery_thread = threading.Thread(
                target=self._recover, args=(error,), name=f"{self._name}-recovery", daemon=True
            )
            self._recovery_thread.start()
        elif step.detach:
            _log.warning(
                "Connection lost again during recovery", error=str(error), connection=self._name
            )

    def _detach_all(self) -> None:
        """Put every producer and consumer back into "disconnected": producers
        re-queue what is unconfirmed, consumers drop what their channel buffered."""
        with self._cond:
            self._blocked = None
            producers = list(self._producers)
            consumers = list(self._consumers.values())
        with self._flow_lock:
            self._flow_timer_at = None  # its timer went with the transport
        for producer in producers:
            producer._lost()
        for consumer in consumers:
            consumer._lost()

    # ------------------------------------------------------------ recovery
    def _recover(self, error: ConnectionLostError) -> None:
        if self.config.reconnect_attempts == 0:
            self._give_up(error, 0)
            return
        attempts = 0
        try:
            for attempt in reconnect_strategy(self.config, sleep=self._sleep):
                with attempt:
                    attempts += 1
                    if self._link.closed:
                        return
                    self._reconnect_once()
        except JMSException as exc:
            self._give_up(exc, attempts)
            return
        with self._cond:
            if self._link.closed:
                return
            self.reconnect_count += 1
            self._cond.notify_all()
        _log.info(
            "Connection recovered",
            connection=self._name,
            attempts=attempts,
            url=redact(self.url),
        )

    def _reconnect_once(self) -> None:
        """One attempt: open a transport, restore every session on it.

        Raises:
            JMSException: the attempt failed (every producer and consumer is
                disconnected again; the retry policy decides what follows).
        """
        with self._cond:
            if self._link.closed:
                return
            self._link.handle(LinkEvent.ATTEMPT)
        transport, generation = self._new_transport(self._endpoints.next())
        try:
            transport.connect()
            with self._cond:
                link = self._link  # (re-read: close() may have run meanwhile)
                if link.closed:
                    transport.close()
                    return
                self._transport, self._current = transport, generation
                self._link.handle(LinkEvent.CONNECTED)
                sessions = list(self._sessions)
            for session in sessions:
                session._restore()
            with self._cond:
                step = self._link.handle(LinkEvent.RESTORED)
                self._cond.notify_all()
            if step.new is not Link.OPEN:
                raise ConnectionLostError("the connection was lost again while it was restored")
        except JMSException:
            transport.close()
            with self._cond:
                step = self._link.handle(LinkEvent.ATTEMPT_FAILED)
            if step.detach:
                self._detach_all()
            raise

    def _give_up(self, cause: JMSException, attempts: int) -> None:
        error = recovery_failed(self.urls, attempts, cause)
        with self._cond:
            if self._link.state is Link.CLOSED:
                return
            self._link.handle(LinkEvent.GIVE_UP)
            self._error = error
            producers = list(self._producers)
            consumers = list(self._consumers.values())
            self._cond.notify_all()
        _log.error("Connection recovery gave up", error=str(error), connection=self._name)
        for producer in producers:
            producer._fail(error)
        for consumer in consumers:
            consumer._fail(error)
        self._report(error)
