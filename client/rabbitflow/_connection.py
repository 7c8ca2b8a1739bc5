"""ConnectionFactory and Connection: the broker connection on an I/O
thread, and its recovery on a thread of its own.  What it owns apart from
driving them is in ``_connection_core`` (its producers, its consumers' flow
accounting) and ``_recovery`` (its link and transports)."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import tenacity

from . import _system
from ._connection_base import ConnectionBase, TransportFactory, Transports
from ._connection_core import (
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
from ._endpoints import Endpoints, all_failed, parse_urls, redact
from ._exceptions import ConnectionLostError, JMSException
from ._flow import GateEvent
from ._producer_core import ProducerControl
from ._properties import ClientConfig, default_url
from ._recovery import LinkState
from ._session import Session, SessionContext, open_session
from ._session_core import AUTO_ACKNOWLEDGE, ConsumerControl
from ._tls import tls_context
from ._transport import ChannelHandler, PikaTransport, TransportChannel, TransportListener

__all__ = ["Connection", "ConnectionFactory", "ExceptionListener", "connect_first"]

R = TypeVar("R")

Waiter = Callable[[threading.Condition, float], None]


def _condition_wait(condition: threading.Condition, timeout: float) -> None:
    condition.wait(timeout)


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
        _transport_factory: TransportFactory[PikaTransport] | None = None,
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


class Connection(ConnectionBase):
    """A connection to the broker, recovered automatically when lost.

    Created stopped (as in JMS): consumers receive nothing until ``start()``.
    Use as a context manager to close it.  Thread-safe.
    """

    _names = iter(range(1, 1 << 62))

    def __init__(
        self,
        urls: Sequence[str],
        config: ClientConfig,
        transport_factory: TransportFactory[PikaTransport],
        sleep: Callable[[float], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Waiter | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._endpoints = Endpoints(urls)
        self.clock = clock
        self.wait = wait or _condition_wait
        self.config = config
        self._sleep = sleep
        self._name = f"rabbitflow-{next(self._names)}"
        # Guards the link state, the sessions and the producers.
        self._cond = threading.Condition(threading.RLock())
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
        self._started = False
        self._listener: ExceptionListener | None = None
        self._sessions: dict[Session, Callable[[], None]] = {}  # -> its restore
        self._producers = ProducerBook()
        # ids of producers whose pump is posted and has not run yet (set.add
        # and set.discard are atomic: no lock on the send path)
        self._pumps_pending: set[int] = set()
        self._flow = ConsumerFlowBook(
            config, clock, lock=threading.Lock(), execute=self._post, arm=self._arm_on_io
        )
        self._recovery_thread: threading.Thread | None = None
        self._transport = connect_first(self._endpoints, self._connected_transport)

    def _connected_transport(self, url: str) -> PikaTransport:
        transport, generation = self._transports.new(url)
        try:
            transport.connect()
        except JMSException:
            transport.close()
            raise
        with self._cond:
            self._state.use(generation)
            self._block_early()
        return transport

    # ------------------------------------------------------------- public
    def create_session(
        self, transacted: bool = False, acknowledge_mode: int = AUTO_ACKNOWLEDGE
    ) -> Session:
        """A new session.

        Raises:
            IllegalStateError: the connection is closed.
            InvalidPropertyError: unknown acknowledge_mode.
        """
        self._state.check_open()
        session, restore = open_session(self._session_context(), transacted, acknowledge_mode)
        with self._cond:
            self._sessions[session] = restore
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
            usable_transport=self._usable_transport,
            holds=self._holds,
            open_channel=self._open_channel,
            post=self._post,
            call_later=self._call_later,
            report=self._report,
            started=lambda: self._started,
            register_producer=self._register_producer,
            unregister_producer=self._unregister_producer,
            register_consumer=self._register_consumer,
            flow=self._flow,
            closed=self._session_closed,
        )

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
            if self._state.closed:
                return
            sessions = list(self._sessions)
        errors: list[JMSException] = []
        for session in sessions:
            try:
                session.close()
            except JMSException as exc:
                errors.append(exc)
        with self._cond:
            self._state.close()
            self._cond.notify_all()
        self._transport.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Connection {self._name} {self._state.state.value} started={self._started}>"

    # -------------------------------------------------- used by the layers
    def _wait_usable(self) -> None:
        """Return when the connection is open; wait while it recovers.

        Raises:
            IllegalStateError: closed.
            ConnectionLostError: recovery gave up.
        """
        if self._state.usable:
            return  # the common case, without the lock
        with self._cond:
            while not self._state.check_usable():
                self._cond.wait(0.5)

    def _recovering_or_lost(self) -> bool:
        return self._state.recovering or self._transport.lost

    def _usable_transport(self) -> int:
        """Return when the connection is open: the generation of the transport
        in use then, read under the lock with that check (one after a loss
        and reconnection is that of a transport still being restored).

        Raises:
            IllegalStateError: closed.
            ConnectionLostError: recovery gave up.
        """
        with self._cond:
            while not self._state.check_usable():
                self._cond.wait(0.5)
            return self._state.in_use

    def _holds(self, opened_on: int) -> bool:
        with self._cond:
            return self._state.holds(opened_on)

    def _report(self, error: JMSException) -> None:
        report(self._listener, error)

    def _open_channel(self, handler: ChannelHandler) -> TransportChannel:
        return self._transport.open_channel(handler)

    def _post(self, fn: Callable[[], None]) -> None:
        self._transport.post(fn)

    def _call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self._transport.call_later(delay, fn)

    def _arm_on_io(self, delay: float, fn: Callable[[], None]) -> None:
        """``fn`` in ``delay`` s on the I/O thread (a timer of the transport in use)."""
        transport = self._transport
        transport.post(lambda: transport.call_later(delay, fn))

    def _register_producer(
        self, producer: ProducerControl[TransportChannel], opened_on: int
    ) -> bool:
        """Register a new producer whose channel was opened on transport
        ``opened_on`` (its generation).

        False, registering nothing, when that transport is no longer in use
        or the link is not open: a loss came after the channel opened, and
        its recovery detaches and restores only the producers registered
        before it; the caller opens another channel.  The session holds its
        own lock around this call, so a restore sees the producer once the
        connection has it.
        """
        with self._cond:
            if not self._state.holds(opened_on):
                return False
            blocked = self._producers.add(producer)
        if blocked is not None:
            # Gated outside the lock (the producer takes its own): an unblock
            # the I/O thread handled meanwhile found the producer still open,
            # so look again once it is blocked.
            producer.gate(GateEvent.BLOCKED, blocked)
            with self._cond:
                unblocked = self._producers.blocked is None
            if unblocked:
                producer.gate(GateEvent.UNBLOCKED, "")
        return True

    def _unregister_producer(self, producer: ProducerControl[TransportChannel]) -> None:
        with self._cond:
            self._producers.remove(producer)

    def _register_consumer(
        self, consumer: ConsumerControl[TransportChannel], app_acks: bool, opened_on: int
    ) -> bool:
        """Register a new consumer whose channel was opened on transport
        ``opened_on`` with the flow accounting (which starts it consuming).

        False, registering nothing, as for a producer (``_register_producer``).
        Under the lock, so that a loss's detach, which comes after the link
        state saw the loss, sees the consumer registered (the flow book takes
        its own lock under this one, never the other way round).
        """
        with self._cond:
            if not self._state.holds(opened_on):
                return False
            self._flow.register(consumer, app_acks)
        return True

    def _session_closed(self, session: Session) -> None:
        with self._cond:
            self._sessions.pop(session, None)

    # ----------------------------------------- transport events (I/O thread)
    def _on_blocked(self, generation: int, reason: str) -> None:
        """connection.blocked: every producer waits."""
        with self._cond:
            if not self._state.block_applies(generation, reason):
                return  # kept if the transport is being opened; see _block_early
            producers = self._producers.block(reason)
        for producer in producers:
            producer.gate(GateEvent.BLOCKED, reason)

    def _on_unblocked(self, generation: int) -> None:
        """connection.unblocked: producers resume."""
        with self._cond:
            if not self._state.block_applies(generation, None):
                return
            producers = self._producers.unblock()
        for producer in producers:
            producer.gate(GateEvent.UNBLOCKED, "")

    def _on_lost(self, generation: int, error: ConnectionLostError) -> None:
        """The current transport died (also during recovery): every producer and
        consumer is disconnected at once; recovery starts or tries again."""
        with self._cond:
            step = self._state.lost(generation)
            self._cond.notify_all()
        if step is None:
            return  # a transport already replaced (or a failed attempt's)
        if step.detach:
            self._detach_all()
        log_lost(step, error, self._name, self.url)
        if step.start_recovery:
            self._recovery_thread = threading.Thread(
                target=self._recover, args=(error,), name=f"{self._name}-recovery", daemon=True
            )
            self._recovery_thread.start()

    def _block_early(self) -> None:
        """Under the lock, once a transport is put in use: block the connection
        if the broker blocked that transport while it was being opened.

        Before anything is restored on it, so that producers come back
        blocked (DISCONNECTED_BLOCKED, then BLOCKED); told under the lock, so
        that the transport's connection.unblocked, which now applies and waits
        for the lock, cannot overtake the block.
        """
        reason = self._state.blocked_early()
        if reason is not None:
            for producer in self._producers.block(reason):
                producer.gate(GateEvent.BLOCKED, reason)

    def _detach_all(self) -> None:
        """Put every producer and consumer back into "disconnected": producers
        re-queue what is unconfirmed, consumers drop what their channel buffered."""
        with self._cond:
            producers = self._producers.unblock()
        self._flow.timer_lost()  # its timer went with the transport
        detach(producers, self._flow.consumers())

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
                    if self._state.closed:
                        return
                    self._reconnect_once()
        except JMSException as exc:
            self._give_up(exc, attempts)
            return
        with self._cond:
            recovered = self._state.recovered()
            self._cond.notify_all()
        if recovered:
            log_recovered(self._name, attempts, self.url)

    def _reconnect_once(self) -> None:
        """One attempt: open a transport, restore every session on it.

        Raises:
            JMSException: the attempt failed (every producer and consumer is
                disconnected again; the retry policy decides what follows).
        """
        with self._cond:
            if not self._state.attempt():
                return
        transport, generation = self._transports.new(self._endpoints.next())
        try:
            transport.connect()
            with self._cond:
                if not self._state.connected(generation):  # closed meanwhile
                    transport.close()
                    return
                self._transport = transport
                restores = list(self._sessions.values())
                self._block_early()
            for restore in restores:
                restore()
            with self._cond:
                self._cond.notify_all()
                self._state.restored()
        except JMSException:
            transport.close()
            with self._cond:
                detach_all = self._state.attempt_failed()
            if detach_all:
                self._detach_all()
            raise

    def _give_up(self, cause: JMSException, attempts: int) -> None:
        error = recovery_failed(self.urls, attempts, cause)
        with self._cond:
            gave_up = self._state.give_up(error)
            producers = self._producers.all()
            self._cond.notify_all()
        if gave_up:
            fail(error, self._name, producers, self._flow.consumers())
            self._report(error)
