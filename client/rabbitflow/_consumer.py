"""MessageConsumer: receive / listener delivery under Open MQ flow limits."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import _otel
from ._consumer_flow import ConsumerFlowStats
from ._destination import Destination, Queue, Topic
from ._exceptions import IllegalStateError, JMSException
from ._log import get_logger
from ._message import Message
from ._session_core import ConsumerControl
from ._transport_base import Delivery
from ._transport_channel import TransportChannel

__all__ = ["ConsumerContext", "MessageConsumer", "open_consumer"]

_ids = itertools.count(1)
_log = get_logger()
MessageListener = Callable[[Message], None]


@dataclass(frozen=True, slots=True)
class ConsumerContext:
    """What a consumer needs from its session and connection."""

    started: Callable[[], bool]  # delivery to the application is on
    report: Callable[[JMSException], None]  # to the exception listener
    flow_stats: Callable[[int], ConsumerFlowStats]
    flow_delivered: Callable[[int], None]  # the broker delivered one message
    # the application's message for a buffered delivery of a channel generation
    to_message: Callable[[ConsumerControl[TransportChannel], int, Delivery], Message]
    processed: Callable[[ConsumerControl[TransportChannel], int, Delivery], None]  # handed out
    closed: Callable[[ConsumerControl[TransportChannel], int], None]  # closed, dropping n buffered


class MessageConsumer:
    """Receives messages from a queue or topic.

    At most ``imqConsumerFlowLimit`` messages are buffered (delivered and not
    yet returned by ``receive()`` / handed to the listener); see
    ``flow_stats()``.  Delivery is paused while the connection is stopped.
    """

    def __init__(
        self,
        context: ConsumerContext,
        destination: Destination,
        queue: str,
        *,
        subscription: str | None = None,
    ) -> None:
        self.id = next(_ids)
        self._context = context
        self._destination = destination
        self._queue = queue  # the AMQP queue consumed (server-named for topics)
        self.subscription = subscription
        self._cond = threading.Condition()
        self._buffer: collections.deque[tuple[int, Delivery]] = collections.deque()
        self._channel: TransportChannel | None = None
        self._generation = 0
        self._listener: MessageListener | None = None
        self._listener_thread: threading.Thread | None = None
        self._closed = False
        self._error: JMSException | None = None
        self._pending: tuple[int, Delivery] | None = None  # in the listener
        self._tracer = _otel.find_tracer()  # once: None unless tracing is configured
        self._control = ConsumerControl(
            self.id,
            destination,
            queue_name=lambda: self._queue,
            channel=lambda: self._channel,
            generation=lambda: self._generation,
            attach=self._attach,
            resubscribed=self._resubscribed,
            lost=self._lost,
            failed=self._fail,
            wake=self._wake,
        )

    @property
    def destination(self) -> Destination:
        """The destination consumed."""
        return self._destination

    @property
    def queue_name(self) -> str:
        """The AMQP queue consumed (for a topic: its subscription queue)."""
        return self._queue

    @property
    def buffered_count(self) -> int:
        """Messages delivered by the broker and not yet processed."""
        return self.flow_stats().buffered

    def flow_stats(self) -> ConsumerFlowStats:
        """Delivered / processed / buffered counters and credit grant sizes."""
        return self._context.flow_stats(self.id)

    # ------------------------------------------------------------- receive
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; waits up to ``timeout`` seconds (None: forever).

        Returns None on timeout, or when the consumer is closed while waiting.

        Raises:
            IllegalStateError: the consumer is closed, or has a message listener.
            ConnectionLostError: the connection was lost and recovery gave up.
        """
        if self._listener is not None:
            raise IllegalStateError("receive() on a consumer with a message listener")
        return self._receive(timeout)

    def receive_no_wait(self) -> Message | None:
        """The next message if one is buffered, else None.

        Raises:
            IllegalStateError: the consumer is closed, or has a message listener.
        """
        return self.receive(0)

    def _receive(self, timeout: float | None, *, listening: bool = False) -> Message | None:
        started = self._context.started
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    if self._listener is None and self._listener_thread is None:
                        raise IllegalStateError("consumer is closed")
                    return None
                if self._error is not None:
                    raise self._error
                if self._buffer and started():
                    generation, delivery = self._buffer.popleft()
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(0.5 if remaining is None else min(remaining, 0.5))
        try:
            message = self._context.to_message(self._control, generation, delivery)
        except JMSException:
            self._context.processed(self._control, generation, delivery)
            raise
        if self._tracer is not None:
            _otel.receive_span(self._tracer, message, self._destination)
        if not listening:
            self._context.processed(self._control, generation, delivery)
            return message
        self._pending = (generation, delivery)
        return message

    # ------------------------------------------------------------ listener
    def set_message_listener(self, listener: MessageListener | None) -> None:
        """Deliver messages to ``listener`` on a dedicated thread (None: stop).

        An exception from the listener is logged; the message counts as
        delivered (as in JMS AUTO_ACKNOWLEDGE, it is not redelivered).

        Raises:
            IllegalStateError: the consumer is closed.
        """
        if self._closed:
            raise IllegalStateError("consumer is closed")
        with self._cond:
            self._listener = listener
            thread = self._listener_thread
            self._cond.notify_all()
        if listener is None:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
            return
        if thread is None or not thread.is_alive():
            thread = threading.Thread(
                target=self._listen, name=f"rabbitflow-listener-{self.id}", daemon=True
            )
            self._listener_thread = thread
            thread.start()

    def get_message_listener(self) -> MessageListener | None:
        """The current listener."""
        return self._listener

    def _listen(self) -> None:
        try:
            while True:
                listener = self._listener
                if listener is None or self._closed:
                    return
                try:
                    message = self._receive(0.2, listening=True)
                except JMSException as exc:
                    self._context.report(exc)
                    return
                if message is None:
                    continue
                try:
                    listener(message)
                except Exception:
                    _log.exception(
                        "Message listener raised", consumer=self.id, message_id=message.message_id
                    )
                finally:
                    # Open MQ counts a message as consumed when the listener returns.
                    pending, self._pending = self._pending, None
                    if pending is not None:
                        self._context.processed(self._control, *pending)
        finally:
            with self._cond:
                self._listener_thread = None

    # --------------------------------------------------------------- close
    def close(self) -> None:
        """Stop consuming; buffered messages go back to the broker (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            dropped = len(self._buffer)
            self._buffer.clear()
            self._cond.notify_all()
            thread = self._listener_thread
        self._context.closed(self._control, dropped)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    def __enter__(self) -> MessageConsumer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MessageConsumer {self.id} {self._destination} closed={self._closed}>"

    # ------------------------------------------------ ChannelHandler (I/O)
    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Consumers do not publish."""

    def on_flow(self, active: bool) -> None:
        """Flow on a consumer channel does not concern deliveries."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Consumers do not publish."""

    def on_deliver(self, delivery: Delivery) -> None:
        """A message arrived: buffer it."""
        with self._cond:
            if self._closed:
                return
            self._context.flow_delivered(self.id)
            self._buffer.append((self._generation, delivery))
            self._cond.notify_all()

    def on_channel_closed(self, error: JMSException) -> None:
        """The broker closed the consumer's channel or cancelled it."""
        with self._cond:
            self._error = error
            self._cond.notify_all()
        self._context.report(error)

    # ------------------------------------------------------------ recovery
    def _attach(self, channel: TransportChannel) -> None:
        with self._cond:
            self._channel = channel
            self._generation += 1
            self._buffer.clear()  # the broker redelivers them on the new channel
            self._cond.notify_all()

    def _lost(self) -> None:
        """The channel was lost: hand out nothing it delivered (the broker
        redelivers what was not acknowledged), and refuse acknowledge() of
        messages already handed out."""
        with self._cond:
            old, self._channel = self._channel, None
            self._generation += 1
            self._buffer.clear()
            self._cond.notify_all()
        if old is not None:
            old.detach()

    def _fail(self, error: JMSException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    @property
    def is_topic(self) -> bool:
        """True when consuming a topic subscription."""
        return isinstance(self._destination, Topic)

    @property
    def is_queue(self) -> bool:
        """True when consuming a queue."""
        return isinstance(self._destination, Queue)

    def _resubscribed(self, queue: str) -> None:
        self._queue = queue


def open_consumer(
    context: ConsumerContext,
    destination: Destination,
    queue: str,
    *,
    subscription: str | None = None,
) -> tuple[MessageConsumer, ConsumerControl[TransportChannel]]:
    """A new consumer of ``queue``, and the control its session and connection
    drive it through."""
    consumer = MessageConsumer(context, destination, queue, subscription=subscription)
    return consumer, consumer._control
