"""asyncio MessageProducer: ``await send()`` under flow control (drives ``_flow``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _otel as _tracing
from .._destination import Destination
from .._exceptions import (
    IllegalStateError,
    JMSException,
    UnconfirmedMessagesError,
)
from .._flow import (
    Gate,
    GateEvent,
    ProducerWindow,
    SendWait,
)
from .._message import (
    PERSISTENT,
    Message,
)
from .._producer_core import (
    FlowLog,
    Outgoing,
    ProducerControl,
    ProducerCounters,
    outgoing,
    stamp,
    target_of,
    timeout_error,
    wire_items,
)
from .._properties import ClientConfig
from .._transport_base import Delivery
from ._transport import settle

if TYPE_CHECKING:
    from ._transport import AioChannel

__all__ = ["MessageProducer", "ProducerContext", "open_producer"]

_ids = itertools.count(1)
# Bounded work per loop turn, so that other tasks (and the loop's I/O) get
# their turn within milliseconds whatever the capacity.  A send that does not
# suspend is no await at all to asyncio, so a task whose sends never have to
# wait would keep the loop: it yields once every _YIELD_EVERY such sends.
# One pump publishes at most _PUMP_BATCH messages before it lets the loop run.
_YIELD_EVERY = 64
_PUMP_BATCH = 128
# Sends blocked together reach their "delayed" warning (and their timeout)
# together: at most _LOGS_PER_TURN of them log in one loop turn, the others
# in the next turns (a log line can cost a millisecond, and a hundred of
# them in one turn held the loop for 87 ms).
_LOGS_PER_TURN = 8


@dataclass(frozen=True, slots=True)
class ProducerContext:
    """A producer's view of its connection and session."""

    config: ClientConfig
    clock: Callable[[], float]
    usable: Callable[[], bool]  # the connection is open (not recovering)
    wait_usable: Callable[[], Awaitable[None]]  # suspend until it is
    report: Callable[[JMSException], None]  # to the exception listener
    closed: Callable[[MessageProducer], None]  # the producer closed


class MessageProducer(ProducerCounters):
    """Sends messages to a destination, honouring broker flow control, on asyncio.

    ``await send()`` returns once the message is handed to the broker; it
    suspends (never blocking the loop) while the window of ``capacity``
    unconfirmed messages is full, while the broker has flowed the channel
    or blocked the connection, and while nacked messages await re-send.
    Any number of tasks may share a producer.  A task cancelled while it
    waits in ``send()`` has not sent its message; the producer stays usable.
    """

    def __init__(
        self, context: ProducerContext, destination: Destination | None, capacity: int
    ) -> None:
        config = context.config
        self.id = f"aio-producer-{next(_ids)}"
        self._context = context
        self._destination = destination
        self._config = config
        self._clock = context.clock
        self._loop = asyncio.get_running_loop()
        self._window: ProducerWindow[Outgoing] = ProducerWindow(
            capacity,
            backoff_initial=config.nack_backoff_initial_ms / 1000,
            backoff_max=config.nack_backoff_max_ms / 1000,
        )
        self._log = FlowLog(self.id, destination, self._window)
        self._channel: AioChannel | None = None
        # In arrival order: woken oldest first, so no waiting task is starved.
        self._waiters: dict[asyncio.Future[None], None] = {}
        self._pump_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._error: JMSException | None = None
        self._closed = False
        self._streak = 0  # sends since one last suspended (see _YIELD_EVERY)
        self._turn_logs = 0  # wait log lines in this loop turn (see _LOGS_PER_TURN)
        self._tracer = _tracing.find_tracer()  # once: None unless tracing is configured

    # -------------------------------------------------------------- public
    @property
    def unconfirmed_count(self) -> int:
        """Messages sent and not yet confirmed."""
        return self._window.in_flight

    async def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int = PERSISTENT,
        priority: int = 4,
        time_to_live: int = 0,
    ) -> None:
        """Send ``message``; sets its message_id, timestamp, destination and headers.

        Raises:
            FlowControlTimeoutError: flow control held the send for
                ``qpid.flow_control_wait_failure`` ms; the message was not sent.
            ConnectionLostError: the connection was lost and recovery gave up.
            IllegalStateError: the producer, session or connection is closed.
            InvalidDestinationError: no destination, or a second one.
            InvalidPropertyError: bad delivery_mode, priority or time_to_live.
            MessageFormatError: a header or property AMQP cannot carry (a
                string over 255 bytes, an int over 64 bits, a float); the
                message was not sent and the producer stays usable.
        """
        if self._streak >= _YIELD_EVERY:
            # Before anything is accepted: a task cancelled here sent nothing.
            self._streak = 0
            await asyncio.sleep(0)
        target = target_of(self.id, self._closed, self._destination, destination)
        stamp(message, target, delivery_mode, priority, time_to_live)
        tracer = self._tracer
        span = None if tracer is None else _tracing.start_send(tracer, message, target)
        try:
            if self._error is not None:  # the broker closed the channel (as in the sync SDK)
                raise self._error
            if not self._context.usable() or not self._window.can_accept():
                await self._context.wait_usable()
                waited = await self._wait_for_room(target, span)
                self._streak = 0
            else:
                waited = 0.0
                self._streak += 1
            self._window.accept(outgoing(message, target))
        except BaseException as exc:
            if span is not None:
                _tracing.end_send(span, exc)
            raise
        if span is not None:
            _tracing.end_send(span, None, waited)
        if self._pump_handle is None:
            self._pump_handle = self._loop.call_soon(self._pump)

    async def close(self) -> None:
        """Wait until every send is confirmed, then close (idempotent).

        Waits at most ``qpid.flow_control_wait_failure`` (0: not at all).

        Raises:
            UnconfirmedMessagesError: some sent messages were not confirmed in
                time, or the connection failed; ``unconfirmed`` says how many.
        """
        if self._closed:
            return
        wait_s = self._config.wait_failure_ms / 1000
        deadline = self._clock() + wait_s
        while not self._window.idle and self._error is None:
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            await self._changed(min(remaining, 0.5))
        pending = self._window.in_flight
        error = self._error
        self._closed = True
        self._window.handle(GateEvent.CLOSE)
        self._notify()
        for handle in (self._pump_handle, self._timer):
            if handle is not None:
                handle.cancel()
        self._context.closed(self)
        if self._channel is not None:
            await self._channel.close()
        if pending:
            cause = f": {error}" if error else f" within {wait_s:g} s"
            raise UnconfirmedMessagesError(
                f"{self.id}: {pending} sent message(s) not confirmed by the broker{cause}; "
                "they may still be enqueued",
                unconfirmed=pending,
            )

    async def __aenter__(self) -> MessageProducer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"<aio.MessageProducer {self.id} {self._destination} capacity={self.capacity} "
            f"state={self.flow_state} unconfirmed={self._window.in_flight}>"
        )

    # -------------------------------------------------------------- helpers
    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def _changed(self, timeout: float) -> None:
        """Suspend until the window or gate changes, or ``timeout`` seconds pass."""
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters[future] = None
        handle = self._loop.call_later(max(timeout, 0.0), settle, future)
        try:
            await future
        finally:
            handle.cancel()
            self._waiters.pop(future, None)

    async def _wait_for_room(self, target: Destination, span: Any) -> float:
        """Suspend until the window accepts; return the seconds waited under
        flow control.  See send()."""
        wait: SendWait | None = None
        start = self._clock()
        flow_started: float | None = None
        while True:
            if self._closed:
                raise IllegalStateError(f"{self.id} is closed")
            if self._error is not None:
                raise self._error
            if self._window.can_accept():
                return 0.0 if flow_started is None else self._clock() - flow_started
            now = self._clock()
            if self._window.gate.disconnected:
                wait = None
                await self._changed(0.5)
                continue
            if self._config.wait_failure_ms == 0 and not self._window.flow_signalled:
                wait = None
                await self._changed(0.5)
                continue
            if wait is None:
                wait = SendWait(
                    now,
                    notify_period_ms=self._config.notify_period_ms,
                    wait_failure_ms=self._config.wait_failure_ms,
                )
            if flow_started is None and self._window.flow_signalled:
                flow_started = now
                _tracing.blocked(span, self._window.wait_reason())
            step = wait.poll(now)
            if step.notices or step.failed is not None:
                await self._log_turn()
            for notice in step.notices:
                self._log.wait(notice, target)
            if step.failed is not None:
                self._log.wait(step.failed, target)
                _tracing.waited(span, self._clock() - start)
                raise timeout_error(step.failed)
            await self._changed(max(step.wake_at - now, 0.001))

    async def _log_turn(self) -> None:
        """Return in a loop turn where fewer than _LOGS_PER_TURN sends logged."""
        while self._turn_logs >= _LOGS_PER_TURN:
            await asyncio.sleep(0)
        if self._turn_logs == 0:
            self._loop.call_soon(self._new_log_turn)  # runs first in the next turn
        self._turn_logs += 1

    def _new_log_turn(self) -> None:
        self._turn_logs = 0

    # -------------------------------------------------------------- driver
    def _pump(self) -> None:
        """Publish what the window allows now; arm the re-send timer."""
        self._pump_handle = None
        channel = self._channel
        if channel is None or channel.closed:
            return
        now = self._clock()
        publishes = self._window.take(now, _PUMP_BATCH)
        if publishes:
            try:
                channel.publish_many(wire_items(publishes))
            except JMSException:
                return  # the channel/connection is going away; recovery re-sends
        due = self._window.publish_due()
        if due == 0.0 and len(publishes) == _PUMP_BATCH:
            self._pump_handle = self._loop.call_soon(self._pump)  # the rest, next turn
            return
        if due is not None and (self._timer_at is None or self._timer_at > due):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = self._loop.call_later(max(due - self._clock(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer_at = None
        self._timer = None
        self._pump()

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Publisher confirm for ``tag``."""
        window = self._window
        before = (window.can_accept(), window.flow_signalled, window.idle)
        if ack:
            window.ack(tag, multiple)
        else:
            window.nack(tag, multiple, self._clock())
        # Wake the waiting sends only if what they wait on changed: while a
        # nacked message is retried, each of its nacks would otherwise wake
        # every task blocked in send() to find nothing new, in one loop turn.
        if (window.can_accept(), window.flow_signalled, window.idle) != before:
            self._notify()
        # A pump already scheduled publishes what is due (see the sync producer).
        if self._pump_handle is None and self._window.publish_due() is not None:
            self._pump()

    def on_flow(self, active: bool) -> None:
        """Channel.Flow from the broker."""
        self._gate(GateEvent.FLOW_ON if active else GateEvent.FLOW_OFF)

    def on_deliver(self, delivery: Delivery) -> None:
        """Producers do not consume."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Not used: publishes are not mandatory."""

    def on_channel_closed(self, error: JMSException) -> None:
        """The broker closed the producer's channel: sends fail from now on."""
        self._error = error
        self._notify()
        self._context.report(error)

    def _gate(self, event: GateEvent, reason: str = "") -> None:
        if self._window.gate.state is Gate.CLOSED:
            return
        notices = self._window.handle(event, reason)
        self._notify()
        self._log.notices(notices)
        if event in (GateEvent.FLOW_ON, GateEvent.UNBLOCKED, GateEvent.RECONNECTED):
            self._pump()

    def _lost(self) -> None:
        """The connection was lost: everything unconfirmed is re-sent in order
        on the next channel."""
        old, self._channel = self._channel, None
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, None
        if self._window.gate.state is Gate.CLOSED:
            return
        notices = self._window.handle(GateEvent.CONNECTION_LOST)
        self._notify()
        if old is not None:
            old.detach()
        self._log.notices(notices)

    def _attach(self, channel: AioChannel) -> None:
        self._channel = channel
        if self._window.gate.disconnected:
            self._gate(GateEvent.RECONNECTED)

    def _fail(self, error: JMSException) -> None:
        self._error = error
        self._notify()


def open_producer(
    context: ProducerContext, destination: Destination | None, capacity: int
) -> tuple[MessageProducer, ProducerControl[AioChannel]]:
    """A new producer, and the control its session and connection drive it through."""
    producer = MessageProducer(context, destination, capacity)
    control = ProducerControl(producer._attach, producer._gate, producer._lost, producer._fail)
    return producer, control
