"""MessageProducer: flow-controlled, confirmed sends (drives ``_flow``)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _otel
from ._destination import Destination
from ._exceptions import (
    IllegalStateError,
    JMSException,
    UnconfirmedMessagesError,
)
from ._flow import (
    Gate,
    GateEvent,
    ProducerWindow,
    SendWait,
)
from ._message import (
    PERSISTENT,
    Message,
)
from ._producer_core import (
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
from ._properties import ClientConfig
from ._transport_base import Delivery
from ._transport_channel import TransportChannel

__all__ = ["MessageProducer", "ProducerContext", "SessionProducerControl", "open_producer"]

_ids = itertools.count(1)
# A send that finds its pump posted this long ago (s) and not yet run lets
# the I/O thread take the GIL; see MessageProducer._hand_off.
_HANDOFF_AFTER = 0.001
_HANDOFF_MAX = 0.002  # longest such a send waits for the pump to start


@dataclass(frozen=True, slots=True)
class ProducerContext:
    """What a producer needs from its session and connection."""

    config: ClientConfig
    clock: Callable[[], float]
    wait: Callable[[threading.Condition, float], None]  # a condition wait (a test seam)
    pumps_pending: set[int]  # ids of producers whose pump is posted and has not run
    transacted: bool
    wait_usable: Callable[[], None]  # return when the connection is open
    post: Callable[[Callable[[], None]], None]  # run on the I/O thread
    call_later: Callable[[float, Callable[[], None]], None]  # on the I/O thread
    report: Callable[[JMSException], None]  # to the exception listener
    closed: Callable[[MessageProducer], None]  # the producer closed


class MessageProducer(ProducerCounters):
    """Sends messages to a destination, honouring broker flow control.

    ``send()`` returns once the message is handed to the broker; it waits
    while the producer's window of ``capacity`` unconfirmed messages is full,
    while the broker has flowed its channel or blocked the connection, and
    while nacked messages await re-send.  Thread-safe.

    Counters (read-only): ``sent_count`` (accepted by send), ``confirmed_count``,
    ``nacked_count`` (nacks received; each nacked message is re-sent),
    ``resent_count`` (re-published after a connection loss because their
    confirm was lost: the only messages that may arrive twice).
    """

    def __init__(
        self,
        context: ProducerContext,
        destination: Destination | None,
        capacity: int,
    ) -> None:
        config = context.config
        self.id = f"producer-{next(_ids)}"
        self._context = context
        self._destination = destination
        self._config = config
        self._clock = context.clock
        self._wait = context.wait
        self._pumps_pending = context.pumps_pending
        self._transacted = context.transacted
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._pumped = threading.Condition(lock)  # notified when a pump starts
        self._window: ProducerWindow[Outgoing] = ProducerWindow(
            capacity,
            backoff_initial=config.nack_backoff_initial_ms / 1000,
            backoff_max=config.nack_backoff_max_ms / 1000,
        )
        self._log = FlowLog(self.id, destination, self._window)
        self._channel: TransportChannel | None = None
        self._pump_scheduled = False
        self._pump_posted_at = 0.0
        self._io_thread: int | None = None  # ident of the thread that runs pumps
        self._timer_at: float | None = None
        self._error: JMSException | None = None
        self._closed = False
        self._returned = 0
        # Once, not per send: the bound method posted by sends, and the tracer
        # (None unless the application configured OpenTelemetry tracing).
        self._post_pump: Callable[[], None] = self._pump
        self._tracer = _otel.find_tracer()

    # -------------------------------------------------------------- public
    @property
    def resent_unconfirmed_count(self) -> int:
        """Alias of ``resent_count``."""
        return self._window.resent_count

    @property
    def unconfirmed_count(self) -> int:
        """Messages sent and not yet confirmed."""
        with self._cond:
            return self._window.in_flight

    def send(
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
            InvalidDestinationError: no destination, or one given to a producer
                that has its own.
            InvalidPropertyError: bad delivery_mode, priority or time_to_live.
            MessageFormatError: a header or property AMQP cannot carry (a
                string over 255 bytes, an int over 64 bits, a float); the
                message was not sent and the producer stays usable.
        """
        target = target_of(self.id, self._closed, self._destination, destination)
        stamp(message, target, delivery_mode, priority, time_to_live)
        tracer = self._tracer
        span = None if tracer is None else _otel.start_send(tracer, message, target)
        item = outgoing(message, target)
        try:
            self._context.wait_usable()
            with self._cond:
                waited = self._wait_for_room(target, span)
                self._window.accept(item)
                schedule = not self._pump_scheduled
                self._pump_scheduled = True
                if schedule:
                    self._pump_posted_at = self._clock()
                    self._pumps_pending.add(id(self))
                else:
                    self._hand_off()
        except BaseException as exc:
            if span is not None:
                _otel.end_send(span, exc)
            raise
        if span is not None:
            _otel.end_send(span, None, waited)
        if schedule:
            self._context.post(self._post_pump)

    def close(self) -> None:
        """Wait until every send is confirmed, then close (idempotent).

        Waits at most ``qpid.flow_control_wait_failure`` (0: not at all).

        Raises:
            UnconfirmedMessagesError: some sent messages were not confirmed in
                time, or the connection failed; ``unconfirmed`` says how many.  They may still be
                enqueued: the broker may have taken them without its confirm
                arriving in time.
        """
        with self._cond:
            if self._closed:
                return
            wait_s = self._config.wait_failure_ms / 1000
            deadline = self._clock() + wait_s
            while not self._window.idle and self._error is None:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._wait(self._cond, min(remaining, 0.5))
            pending = self._window.in_flight
            error = self._error
            self._closed = True
            self._window.handle(GateEvent.CLOSE)
            self._cond.notify_all()
        self._context.closed(self)
        if self._channel is not None and not self._transacted:
            self._channel.close()
        if pending:
            cause = f": {error}" if error else f" within {wait_s:g} s"
            raise UnconfirmedMessagesError(
                f"{self.id}: {pending} sent message(s) not confirmed by the broker{cause}; "
                "they may still be enqueued",
                unconfirmed=pending,
            )

    def __enter__(self) -> MessageProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<MessageProducer {self.id} {self._destination} capacity={self.capacity} "
            f"state={self.flow_state} unconfirmed={self._window.in_flight}>"
        )

    # -------------------------------------------------------------- helpers
    def _wait_for_room(self, target: Destination, span: Any = None) -> float:
        """Wait (holding ``_cond``) until the window accepts; return the
        seconds waited under a flow signal.  See send()."""
        wait: SendWait | None = None
        flow_started: float | None = None
        while True:
            if self._closed:
                raise IllegalStateError(f"{self.id} is closed")
            if self._error is not None:
                raise self._error
            if self._window.can_accept():
                return 0.0 if flow_started is None else self._clock() - flow_started
            now = self._clock()
            if flow_started is None and self._window.flow_signalled:
                flow_started = now
                _otel.blocked(span, self._window.wait_reason())
            wait = self._wait_once(wait, now, target)

    def _wait_once(
        self, wait: SendWait | None, now: float, target: Destination | None
    ) -> SendWait | None:
        """Wait once (holding ``_cond``) for the window to move on; return the
        bookkeeping of the wait to pass to the next call.

        Raises:
            FlowControlTimeoutError: flow control held it for
                ``qpid.flow_control_wait_failure`` ms.
        """
        if self._window.gate.disconnected:
            # Recovery decides (whether or not the new connection is
            # blocked): no flow control timeout; its failure sets _error.
            self._cond.wait(0.5)
            return None
        if self._config.wait_failure_ms == 0 and not self._window.flow_signalled:
            # SPEC: 0 means "raise at once under flow control"; a window
            # merely full is not flow control, so wait for its confirms
            # silently (a dead connection ends the wait through recovery).
            self._wait(self._cond, 0.5)
            return None
        if wait is None:
            wait = SendWait(
                now,
                notify_period_ms=self._config.notify_period_ms,
                wait_failure_ms=self._config.wait_failure_ms,
            )
        step = wait.poll(now)
        for notice in step.notices:
            self._log.wait(notice, target)
        if step.failed is not None:
            self._log.wait(step.failed, target)
            raise timeout_error(step.failed)
        self._wait(self._cond, max(step.wake_at - now, 0.001))
        return wait

    def _hand_off(self) -> None:
        """Let the posted pump run if it has waited ``_HANDOFF_AFTER`` (holding ``_cond``).

        The I/O thread that is to publish what this thread accepts needs the
        GIL, and a thread that keeps sending holds it until it blocks (the
        window full) or CPython's switch interval (5 ms) passes, so a window
        freed by a confirm batch would go out only once refilled.  Waiting on
        a lock gives the GIL away at once; the message is already accepted,
        so this wait changes nothing but when its publish is written.
        """
        now = self._clock()
        if now - self._pump_posted_at < _HANDOFF_AFTER or len(self._pumps_pending) > 1:
            # Other producers' pumps wait too: their threads already pass the
            # GIL around, and the I/O thread batches their publishes.
            return
        self._pump_posted_at = now  # if the pump is slow, do not wait on every send
        if threading.get_ident() != self._io_thread:  # it cannot wait for itself
            self._wait(self._pumped, _HANDOFF_MAX)

    # ------------------------------------------------- I/O thread (driver)
    def _pump(self) -> None:
        """Publish what the window allows now; arm the re-send timer."""
        with self._cond:
            self._pump_scheduled = False
            self._pumps_pending.discard(id(self))
            self._io_thread = threading.get_ident()
            self._pumped.notify_all()
            channel = self._channel
            if channel is None or channel.closed:
                return
            now = self._clock()
            publishes = self._window.take(now)
            due = self._window.publish_due()
        try:
            if publishes:
                channel.publish_many(wire_items(publishes), False)
        except JMSException:
            return  # the channel/connection is going away; recovery re-sends
        if self._transacted and publishes:
            # No confirms on a tx channel: completion is the commit.
            with self._cond:
                self._window.ack(publishes[-1].tag, True)
                self._cond.notify_all()
        if due is not None and (self._timer_at is None or self._timer_at > due):
            # After a take, only a retry backoff can be due (at once would
            # have been taken); the timer publishes when it ends.
            self._timer_at = due
            self._context.call_later(max(due - self._clock(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer_at = None
        self._pump()

    # ------------------------------------------------ ChannelHandler (I/O)
    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Publisher confirm for ``tag``."""
        with self._cond:
            if ack:
                self._window.ack(tag, multiple)
            else:
                self._window.nack(tag, multiple, self._clock())
            # Not only while retrying: the ack that ends a retry must also
            # publish what was accepted before the nack and held since.  A
            # pump already posted publishes it; running one here as well
            # would leave the posted one nothing to do and make the next
            # send post another.
            due = None if self._pump_scheduled else self._window.publish_due()
            self._cond.notify_all()
        if due is not None:
            self._pump()

    def on_flow(self, active: bool) -> None:
        """Channel.Flow from the broker."""
        self._gate(GateEvent.FLOW_ON if active else GateEvent.FLOW_OFF)

    def on_deliver(self, delivery: Delivery) -> None:
        """Producers do not consume."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """A mandatory publish came back unroutable."""
        self._returned += 1

    def on_channel_closed(self, error: JMSException) -> None:
        """The broker closed the producer's channel: sends fail from now on."""
        with self._cond:
            self._error = error
            self._cond.notify_all()
        self._context.report(error)

    # ------------------------------------------- connection-level (any thread)
    def _gate(self, event: GateEvent, reason: str = "") -> None:
        with self._cond:
            if self._window.gate.state is Gate.CLOSED:
                return
            notices = self._window.handle(event, reason)
            self._cond.notify_all()
        self._log.notices(notices)
        if event in (GateEvent.FLOW_ON, GateEvent.UNBLOCKED, GateEvent.RECONNECTED):
            self._context.post(self._pump)

    def _lost(self) -> None:
        """The connection (or a recovery attempt) was lost: leave its channel;
        everything unconfirmed is re-sent in order, with fresh confirm tags, on
        the next channel."""
        with self._cond:
            old, self._channel = self._channel, None
            # A re-send timer armed on the lost connection's I/O loop dies
            # with it; a stale mark would stop the next one being armed.
            self._timer_at = None
            if self._window.gate.state is Gate.CLOSED:
                return
            notices = self._window.handle(GateEvent.CONNECTION_LOST)
            self._cond.notify_all()
        if old is not None:
            old.detach()  # a late confirm of the dead channel must not count
        self._log.notices(notices)

    def _attach(self, channel: TransportChannel) -> None:
        """Use ``channel`` (fresh, or after a reconnection) and publish what is queued."""
        with self._cond:
            self._channel = channel
            reconnected = self._window.gate.disconnected
        if reconnected:
            self._gate(GateEvent.RECONNECTED)

    def _fail(self, error: JMSException) -> None:
        """Recovery gave up: every waiting and future send raises ``error``."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    # ------------------------------------------ transacted session (any thread)
    def _discard(self) -> int:
        """The transaction rolls back: drop what send() accepted and the pump
        has not published (else it would go out later, in the next
        transaction); return how many.  Sends waiting for room go on."""
        with self._cond:
            dropped = self._window.drop_queued()
            self._cond.notify_all()
        return dropped

    def _flush(self) -> None:
        """The transaction commits: return once everything send() accepted
        before this call is published on the channel, ahead of its tx.commit
        (the pump publishes it; under flow control, waiting as a send does).
        What other threads send meanwhile is not waited for: it goes in the
        next transaction, or this one if published before the tx.commit.  A
        closed producer's channel is not committed: nothing to wait for.

        Raises:
            FlowControlTimeoutError: flow control held it back for
                ``qpid.flow_control_wait_failure`` ms; it stays unpublished.
            JMSException: the broker closed the channel, or recovery gave up.
        """
        with self._cond:
            last = self._window.last_accepted
            wait: SendWait | None = None
            while not self._window.published_through(last) and not self._closed:
                if self._error is not None:
                    raise self._error
                if self._window.flow_signalled or self._window.gate.disconnected:
                    wait = self._wait_once(wait, self._clock(), None)
                else:  # the pump is on its way: no flow control to time out on
                    wait = None
                    self._wait(self._cond, 0.5)


@dataclass(frozen=True, eq=False, slots=True)
class SessionProducerControl(ProducerControl[TransportChannel]):
    """A sync producer as its session and connection drive it: also what a
    transacted session's rollback and commit do to its unpublished messages."""

    discard: Callable[[], int]  # rollback: drop them; how many
    flush: Callable[[], None]  # commit: publish them first (see MessageProducer._flush)


def open_producer(
    context: ProducerContext, destination: Destination | None, capacity: int
) -> tuple[MessageProducer, SessionProducerControl]:
    """A new producer, and the control its session and connection drive it through."""
    producer = MessageProducer(context, destination, capacity)
    control = SessionProducerControl(
        producer._attach,
        producer._gate,
        producer._lost,
        producer._fail,
        producer._discard,
        producer._flush,
    )
    return producer, control
