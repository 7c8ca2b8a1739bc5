"""asyncio MessageConsumer: ``await receive()`` and ``async for`` under Open MQ flow limits."""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _otel
from .._consumer_flow import ConsumerFlowStats
from .._destination import Destination, Topic
from .._exceptions import IllegalStateError, JMSException
from .._message import Message
from .._session_core import ConsumerControl
from .._transport_base import Delivery
from ._transport import settle

if TYPE_CHECKING:
    from ._transport import AioChannel

__all__ = ["ConsumerContext", "MessageConsumer", "open_consumer"]

_ids = itertools.count(1_000_000)  # apart from the sync consumers' ids


@dataclass(frozen=True, slots=True)
class ConsumerContext:
    """A consumer's view of its connection and session."""

    started: Callable[[], bool]  # delivery to the application is on
    report: Callable[[JMSException], None]
    flow_stats: Callable[[int], ConsumerFlowStats]
    flow_delivered: Callable[[int], None]  # the broker delivered one message
    to_message: Callable[[ConsumerControl[AioChannel], int, Delivery], Message]
    processed: Callable[[ConsumerControl[AioChannel], int, Delivery], None]  # handed out
    closed: Callable[[ConsumerControl[AioChannel]], Awaitable[None]]  # the consumer closed


class MessageConsumer:
    """Receives messages from a queue or topic on asyncio.

    At most ``imqConsumerFlowLimit`` messages are buffered ahead of the
    application (and at most ``imqConnectionFlowLimit`` for the whole
    connection when enabled).  ``async for message in consumer`` ends when
    the consumer is closed.
    """

    def __init__(
        self,
        context: ConsumerContext,
        destination: Destination,
        queue: str,
        *,
        subscription: str | None,
    ) -> None:
        self.id = next(_ids)
        self._context = context
        self._destination = destination
        self._queue = queue
        self.subscription = subscription
        self._buffer: collections.deque[tuple[int, Delivery]] = collections.deque()
        # In arrival order: woken oldest first, so no waiting task is starved.
        self._waiters: dict[asyncio.Future[None], None] = {}
        self._channel: AioChannel | None = None
        self._generation = 0
        self._closed = False
        self._error: JMSException | None = None
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
    def is_topic(self) -> bool:
        """True when consuming a topic subscription."""
        return isinstance(self._destination, Topic)

    def flow_stats(self) -> ConsumerFlowStats:
        """Delivered / processed / buffered counters and credit grant sizes."""
        return self._context.flow_stats(self.id)

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; waits up to ``timeout`` seconds (None: forever).

        Returns None on timeout, or when the consumer is closed while waiting.

        Raises:
            IllegalStateError: the consumer is closed.
            ConnectionLostError: the connection was lost and recovery gave up.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        started = self._context.started
        while True:
            if self._closed:
                raise IllegalStateError("consumer is closed")
            if self._error is not None:
                raise self._error
            if self._buffer and started():
                generation, delivery = self._buffer.popleft()
                break
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            future: asyncio.Future[None] = loop.create_future()
            self._waiters[future] = None
            handle = None if remaining is None else loop.call_later(remaining, settle, future)
            try:
                await future
            finally:
                if handle is not None:
                    handle.cancel()
                self._waiters.pop(future, None)
            if self._is_closed():
                return None
        try:
            message = self._context.to_message(self._control, generation, delivery)
        finally:
            self._context.processed(self._control, generation, delivery)
        if self._tracer is not None:
            _otel.receive_span(self._tracer, message, self._destination)
        return message

    def receive_no_wait(self) -> Message | None:
        """The next message if one is buffered, else None.

        Raises:
            IllegalStateError: the consumer is closed.
        """
        if self._closed:
            raise IllegalStateError("consumer is closed")
        if self._error is not None:
            raise self._error
        if not self._buffer or not self._context.started():
            return None
        generation, delivery = self._buffer.popleft()
        try:
            message = self._context.to_message(self._control, generation, delivery)
        finally:
            self._context.processed(self._control, generation, delivery)
        if self._tracer is not None:
            _otel.receive_span(self._tracer, message, self._destination)
        return message

    def _is_closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> MessageConsumer:
        return self

    async def __anext__(self) -> Message:
        if self._closed:
            raise StopAsyncIteration
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    async def close(self) -> None:
        """Stop consuming; buffered messages go back to the broker (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        self._wake()
        await self._context.closed(self._control)

    async def __aenter__(self) -> MessageConsumer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio.MessageConsumer {self.id} {self._destination} closed={self._closed}>"

    # ------------------------------------------------ ChannelHandler (loop)
    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Consumers do not publish."""

    def on_flow(self, active: bool) -> None:
        """Flow on a consumer channel does not concern deliveries."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Consumers do not publish."""

    def on_deliver(self, delivery: Delivery) -> None:
        """A message arrived: buffer it."""
        if self._closed:
            return
        self._context.flow_delivered(self.id)
        self._buffer.append((self._generation, delivery))
        self._wake()

    def on_channel_closed(self, error: JMSException) -> None:
        """The broker closed the consumer's channel or cancelled it."""
        self._error = error
        self._wake()
        self._context.report(error)

    def _attach(self, channel: AioChannel) -> None:
        self._channel = channel
        self._generation += 1
        self._buffer.clear()

    def _lost(self) -> None:
        old, self._channel = self._channel, None
        self._generation += 1
        self._buffer.clear()
        self._wake()
        if old is not None:
            old.detach()

    def _fail(self, error: JMSException) -> None:
        self._error = error
        self._wake()

    def _resubscribed(self, queue: str) -> None:
        self._queue = queue


def open_consumer(
    context: ConsumerContext,
    destination: Destination,
    queue: str,
    *,
    subscription: str | None = None,
) -> tuple[MessageConsumer, ConsumerControl[AioChannel]]:
    """A new consumer of ``queue``, and the control its session and connection
    drive it through."""
    consumer = MessageConsumer(context, destination, queue, subscription=subscription)
    return consumer, consumer._control
