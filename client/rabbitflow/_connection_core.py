"""What the sync and the asyncio connection share, whatever drives them:
the reconnection policy, the listener that tags a transport's events with
its generation, the error when recovery gives up, the book of its
producers, and its consumers' flow accounting with the machine's actions
carried out on their channels."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import tenacity

from ._consumer_flow import (
    Ack,
    ConnectionFlow,
    ConsumerFlowStats,
    FlowAction,
    ProbeQueue,
    SetPrefetch,
    StartConsuming,
    StopConsuming,
)
from ._endpoints import redact
from ._exceptions import ConnectionLostError, JMSException
from ._log import get_logger
from ._producer_core import ProducerControl
from ._properties import ClientConfig
from ._recovery import Step
from ._session_core import ConsumerControl

__all__ = [
    "ConsumerFlowBook",
    "ExceptionListener",
    "FlowChannel",
    "ProducerBook",
    "TransportEvents",
    "carry_out",
    "detach",
    "fail",
    "log_lost",
    "log_recovered",
    "recovery_failed",
    "report",
    "retry_policy",
]

_log = get_logger()
ExceptionListener = Callable[[JMSException], None]


def retry_policy(config: ClientConfig) -> dict[str, Any]:
    """The reconnection retry policy's tenacity arguments, from configuration.

    Up to ``rabbitflow.reconnect_attempts`` attempts within
    ``rabbitflow.reconnect_timeout`` ms, exponential backoff with jitter from
    ``rabbitflow.reconnect_initial_delay`` to ``rabbitflow.reconnect_max_delay``.
    """
    return {
        "stop": (
            tenacity.stop_after_attempt(max(config.reconnect_attempts, 1))
            | tenacity.stop_after_delay(config.reconnect_timeout_ms / 1000)
        ),
        "wait": tenacity.wait_exponential(
            multiplier=config.reconnect_initial_delay_ms / 1000,
            max=config.reconnect_max_delay_ms / 1000,
        )
        + tenacity.wait_random(0, config.reconnect_initial_delay_ms / 1000),
        "retry": tenacity.retry_if_exception_type(JMSException),
        "reraise": True,
    }


def recovery_failed(urls: Sequence[str], attempts: int, cause: JMSException) -> ConnectionLostError:
    """The error every waiting and later call gets once recovery gave up."""
    error = ConnectionLostError(
        f"connection to {', '.join(redact(u) for u in urls)} lost; recovery gave up after "
        f"{attempts} attempt(s): {cause}"
    )
    error.__cause__ = cause
    return error


def report(listener: ExceptionListener | None, error: JMSException) -> None:
    """Tell the connection's exception listener (what it raises is logged)."""
    if listener is not None:
        try:
            listener(error)
        except Exception:
            _log.exception("Exception listener raised")


def log_lost(step: Step, error: ConnectionLostError, name: str, url: str) -> None:
    """Log a loss of the transport in use that ``step`` acted on."""
    if step.start_recovery:
        _log.warning(
            "Connection lost, recovering", error=str(error), connection=name, url=redact(url)
        )
    elif step.detach:
        _log.warning("Connection lost again during recovery", error=str(error), connection=name)


def log_recovered(name: str, attempts: int, url: str) -> None:
    """Log a recovery that succeeded."""
    _log.info("Connection recovered", connection=name, attempts=attempts, url=redact(url))


def detach(
    producers: Sequence[ProducerControl[Any]], consumers: Sequence[ConsumerControl[Any]]
) -> None:
    """Put every producer and consumer back into "disconnected": producers
    re-queue what is unconfirmed, consumers drop what their channel buffered."""
    for producer in producers:
        producer.lost()
    for consumer in consumers:
        consumer.lost()


def fail(
    error: JMSException,
    name: str,
    producers: Sequence[ProducerControl[Any]],
    consumers: Sequence[ConsumerControl[Any]],
) -> None:
    """Recovery gave up: every waiting and later send and receive raises ``error``."""
    _log.error("Connection recovery gave up", error=str(error), connection=name)
    for producer in producers:
        producer.failed(error)
    for consumer in consumers:
        consumer.failed(error)


class TransportEvents:
    """The listener of one transport: tags its events with the transport's
    generation, so that the connection ignores those of a transport it
    replaced."""

    def __init__(
        self,
        generation: int,
        *,
        blocked: Callable[[int, str], None],
        unblocked: Callable[[int], None],
        lost: Callable[[int, ConnectionLostError], None],
    ) -> None:
        self._generation = generation
        self._blocked = blocked
        self._unblocked = unblocked
        self._lost = lost

    def on_blocked(self, reason: str) -> None:
        """connection.blocked."""
        self._blocked(self._generation, reason)

    def on_unblocked(self) -> None:
        """connection.unblocked."""
        self._unblocked(self._generation)

    def on_lost(self, error: ConnectionLostError) -> None:
        """The transport died."""
        self._lost(self._generation, error)


class FlowChannel(Protocol):
    """The channel operations consumer flow needs (both drivers' channels)."""

    def qos_nowait(self, prefetch_count: int, on_ok: Callable[[], None] | None = None) -> None:
        """basic.qos global=true without waiting; ``on_ok()`` at its qos-ok."""

    def basic_consume_nowait(self, queue: str) -> None:
        """basic.consume without waiting."""

    def basic_cancel_nowait(self, on_ok: Callable[[], None] | None = None) -> None:
        """basic.cancel of the consumer started above; ``on_ok()`` at its
        cancel-ok (at once when there is nothing to cancel)."""

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        """Passive queue.declare; ``on_depth(message_count)`` when it answers."""

    def ack(self, tag: int, *, multiple: bool) -> None:
        """basic.ack."""


def carry_out(
    action: FlowAction,
    channel: FlowChannel,
    queue: str,
    on_depth: Callable[[int], None],
    on_reclaimed: Callable[[], None],
) -> None:
    """Send what one consumer flow action asks for on the consumer's channel
    (``on_reclaimed()`` when the broker confirms a lower prefetch or a cancel
    that takes credit back)."""
    if isinstance(action, SetPrefetch):
        channel.qos_nowait(action.count, on_reclaimed if action.confirm else None)
    elif isinstance(action, StartConsuming):
        channel.basic_consume_nowait(queue)
    elif isinstance(action, StopConsuming):
        channel.basic_cancel_nowait(on_reclaimed)
    elif isinstance(action, ProbeQueue):
        channel.queue_depth_nowait(queue, on_depth)
    elif isinstance(action, Ack):
        channel.ack(action.tag, multiple=True)


class ProducerBook:
    """A connection's producers, and the reason the broker blocks it (so that
    a producer created meanwhile starts blocked).  The driver guards it (the
    sync SDK under its lock) and drives the controls it returns outside."""

    def __init__(self) -> None:
        self._producers: list[ProducerControl[Any]] = []
        self.blocked: str | None = None  # connection.blocked's reason, until unblocked

    def add(self, producer: ProducerControl[Any]) -> str | None:
        """Register ``producer``; the reason the connection is blocked, if it is."""
        self._producers.append(producer)
        return self.blocked

    def remove(self, producer: ProducerControl[Any]) -> None:
        """The producer closed."""
        if producer in self._producers:
            self._producers.remove(producer)

    def block(self, reason: str) -> list[ProducerControl[Any]]:
        """connection.blocked: the producers to tell."""
        self.blocked = reason
        return list(self._producers)

    def unblock(self) -> list[ProducerControl[Any]]:
        """connection.unblocked, or the connection was lost (a new one starts
        unblocked): the producers to tell."""
        self.blocked = None
        return list(self._producers)

    def all(self) -> list[ProducerControl[Any]]:
        """Every producer."""
        return list(self._producers)


class Cancellable(Protocol):
    """A timer that can be cancelled (an asyncio handle)."""

    def cancel(self) -> None:
        """Do not call it."""


class ConsumerFlowBook:
    """A connection's consumers and their flow accounting: the pure
    ``ConnectionFlow`` machine, its actions carried out on the consumers'
    channels in the order decided, and its timer.

    The driver says how: ``lock`` guards the book (a thread lock in the sync
    SDK, where consumers, the application and the I/O thread share it; none
    on one event loop); ``execute(run)`` runs a batch of actions where the
    channels may be used (posted to the I/O thread, or at once on the loop);
    ``arm(delay, fn)`` calls ``fn`` later and may return a handle to cancel.
    """

    def __init__(
        self,
        config: ClientConfig,
        clock: Callable[[], float],
        *,
        lock: AbstractContextManager[Any],
        execute: Callable[[Callable[[], None]], None],
        arm: Callable[[float, Callable[[], None]], Cancellable | None],
    ) -> None:
        self._config = config
        self._clock = clock
        self._lock = lock
        self._execute = execute
        self._arm = arm
        self._flow = ConnectionFlow(
            config.connection_flow_limit if config.connection_flow_limit_enabled else None
        )
        self._consumers: dict[int, ConsumerControl[Any]] = {}
        self._timer_at: float | None = None
        self._timer: Cancellable | None = None

    @property
    def buffered(self) -> int:
        """Messages buffered for all the consumers."""
        with self._lock:
            return self._flow.buffered

    def consumers(self) -> list[ConsumerControl[Any]]:
        """Every registered consumer."""
        with self._lock:
            return list(self._consumers.values())

    def activate(self) -> None:
        """The connection started: grant the first credit (once)."""
        with self._lock:
            if not self._flow.active:
                self._apply(self._flow.activate(now=self._clock()))

    def register(self, consumer: ConsumerControl[Any], app_acks: bool) -> None:
        """A consumer started (``app_acks``: the application acknowledges)."""
        with self._lock:
            self._consumers[consumer.id] = consumer
            self._apply(
                self._flow.register(
                    consumer.id,
                    limit=self._config.consumer_flow_limit,
                    threshold_pct=self._config.consumer_flow_threshold,
                    app_acks=app_acks,
                    now=self._clock(),
                )
            )

    def unregister(self, consumer_id: int) -> None:
        """The consumer closed."""
        with self._lock:
            self._apply(self._flow.unregister(consumer_id, now=self._clock()))
            self._consumers.pop(consumer_id, None)

    def reset(self, consumer_id: int) -> None:
        """The consumer has a new channel: fresh accounting."""
        with self._lock:
            if consumer_id in self._consumers:
                self._apply(self._flow.reset(consumer_id, now=self._clock()))

    # A consumer closed meanwhile (e.g. while its listener ran) is ignored:
    # closing its channel returned its unacked messages to the queue.
    def delivered(self, consumer_id: int) -> None:
        """The broker delivered a message to the consumer."""
        with self._lock:
            if consumer_id in self._consumers:
                self._flow.delivered(consumer_id, now=self._clock())

    def processed(self, consumer_id: int, tag: int) -> None:
        """The application is done with the delivery ``tag``."""
        with self._lock:
            if consumer_id in self._consumers:
                self._apply(self._flow.processed(consumer_id, tag, now=self._clock()))

    def acknowledged(self, consumer_id: int) -> None:
        """The application acknowledged what the consumer handed out."""
        with self._lock:
            if consumer_id in self._consumers:
                self._apply(self._flow.acknowledged(consumer_id, now=self._clock()))

    def stats(self, consumer_id: int) -> ConsumerFlowStats:
        """The consumer's counters (zeros once it closed)."""
        with self._lock:
            if consumer_id not in self._consumers:
                return ConsumerFlowStats(0, 0, 0, 0, 0, ())
            return self._flow.stats(consumer_id)

    def timer_lost(self) -> None:
        """The timer went with a lost transport: arm the next one anew."""
        with self._lock:
            self._timer_at = None

    def close(self) -> None:
        """Cancel the timer."""
        if self._timer is not None:
            self._timer.cancel()

    def _apply(self, actions: list[FlowAction]) -> None:
        """Carry out flow actions (holding the lock, so that they reach the
        broker in the order decided) and arm the timer when the machine asks."""
        self._arm_timer()
        if not actions:
            return
        bound = []
        for action in actions:
            consumer = self._consumers.get(action.consumer)
            channel = None if consumer is None else consumer.channel()
            if consumer is not None and channel is not None:
                bound.append((action, consumer, channel))
        self._execute(functools.partial(self._run, bound))

    def _run(self, bound: list[tuple[FlowAction, ConsumerControl[Any], FlowChannel]]) -> None:
        for action, consumer, channel in bound:
            if consumer.channel() is not channel or channel.closed:
                continue  # the channel was replaced (recovery): tags are stale
            answer = functools.partial(self._answer, consumer.id)
            carry_out(action, channel, consumer.queue_name(), answer, answer)

    def _arm_timer(self) -> None:
        wake = self._flow.wake_at()
        if wake is None or (self._timer_at is not None and self._timer_at <= wake):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = self._arm(max(wake - self._clock(), 0.0), self._tick)

    def _tick(self) -> None:
        with self._lock:
            self._timer_at = None
            self._timer = None
            self._apply(self._flow.tick(self._clock()))

    def _answer(self, consumer_id: int, depth: int | None = None) -> None:
        """The broker answered a consumer's ProbeQueue (``depth``), or confirmed
        a qos or cancel that takes credit back."""
        with self._lock:
            if consumer_id in self._consumers:
                if depth is None:
                    self._apply(self._flow.reclaim_confirmed(consumer_id, now=self._clock()))
                else:
                    self._apply(self._flow.queue_depth(consumer_id, depth, now=self._clock()))
