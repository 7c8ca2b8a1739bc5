"""asyncio Session: destinations, producers, consumers, acknowledgement."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from .._consumer_flow import ConsumerFlowStats
from .._destination import Destination, Queue, Topic
from .._exceptions import (
    ConnectionLostError,
    IllegalStateError,
    InvalidDestinationError,
    InvalidPropertyError,
    JMSException,
)
from .._message import BytesMessage, Message, TextMessage
from .._properties import ClientConfig
from .._session_core import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    AdminHandler,
    Declarations,
    Declared,
    check_current,
    delivered_message,
)
from .._transport_base import ChannelHandler, Delivery
from ._consumer import ConsumerContext, MessageConsumer
from ._producer import MessageProducer, ProducerContext

if TYPE_CHECKING:
    from ._transport import AioChannel

__all__ = ["ConnectionControl", "Session", "SessionContext"]

R = TypeVar("R")
_MODES = {AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE}


class ConnectionControl(Protocol):
    """The application's view of a session's connection."""

    def start(self) -> None:
        """Start (or resume) delivery to consumers."""

    def stop(self) -> None:
        """Pause delivery to consumers."""

    async def close(self) -> None:
        """Close the connection."""

    def set_exception_listener(self, listener: Callable[[JMSException], None] | None) -> None:
        """Call ``listener(error)`` on asynchronous failures."""


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a session (and through it, its producers and consumers) needs
    from its connection."""

    connection: ConnectionControl
    config: ClientConfig
    clock: Callable[[], float]
    usable: Callable[[], bool]  # the connection is open (not recovering)
    wait_usable: Callable[[], Awaitable[None]]  # suspend until it is
    recovering_or_lost: Callable[[], bool]
    open_channel: Callable[[ChannelHandler], Awaitable[AioChannel]]
    report: Callable[[JMSException], None]  # to the exception listener
    started: Callable[[], bool]  # delivery to consumers is on
    register_producer: Callable[[MessageProducer], None]
    unregister_producer: Callable[[MessageProducer], None]
    register_consumer: Callable[[MessageConsumer, bool], None]  # (consumer, app acks)
    unregister_consumer: Callable[[MessageConsumer], None]
    reset_consumer_flow: Callable[[MessageConsumer], None]  # fresh accounting
    flow_stats: Callable[[int], ConsumerFlowStats]
    flow_delivered: Callable[[int], None]
    flow_processed: Callable[[int, int], None]  # (consumer id, delivery tag)
    flow_acknowledged: Callable[[int], None]
    closed: Callable[[Session], None]  # the session closed


class Session:
    """Creates destinations, producers, consumers and messages on asyncio.

    Every producer has its own confirm-mode channel and every consumer its
    own channel.  Transacted sessions are not offered on asyncio.
    """

    def __init__(self, context: SessionContext, acknowledge_mode: int) -> None:
        if acknowledge_mode not in _MODES:
            raise InvalidPropertyError(
                "acknowledge_mode", f"must be one of AUTO/CLIENT/DUPS_OK, got {acknowledge_mode!r}"
            )
        self._context = context
        #: The connection that created this session.
        self.connection = context.connection
        self.acknowledge_mode = acknowledge_mode
        self.transacted = False
        self._admin_channel: AioChannel | None = None
        self._producers: list[MessageProducer] = []
        self._consumers: list[MessageConsumer] = []
        self._declared = Declarations()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("session is closed")

    async def _rpc(self, fn: Callable[[], Awaitable[R]]) -> R:
        """Run a broker operation, riding out a connection recovery."""
        for _ in range(5):
            await self._context.wait_usable()
            try:
                return await fn()
            except ConnectionLostError:
                if not self._context.recovering_or_lost():
                    raise
        raise ConnectionLostError("connection kept failing during the operation")

    async def _admin(self) -> AioChannel:
        channel = self._admin_channel
        if channel is None or channel.closed:
            channel = await self._context.open_channel(AdminHandler())
            self._admin_channel = channel
        return channel

    async def _ensure_queue(self, name: str) -> None:
        try:
            await (await self._admin()).queue_declare(name, passive=True)
        except InvalidDestinationError:
            await (await self._admin()).queue_declare(name, durable=True)

    async def _ensure_exchange(self, name: str) -> None:
        try:
            await (await self._admin()).exchange_declare(name, "topic", passive=True)
        except InvalidDestinationError:
            await (await self._admin()).exchange_declare(name, "topic")

    def _record(self, kind: Declared, name: str, subscription: str = "") -> None:
        self._declared.record(kind, name, subscription)

    # ------------------------------------------------------- destinations
    async def create_queue(self, name: str) -> Queue:
        """The queue ``name``; declared (durable, no arguments) only if missing.

        Raises:
            InvalidDestinationError: bad name.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        queue = Queue(name)
        await self._rpc(lambda: self._ensure_queue(name))
        self._record(Declared.QUEUE, name)
        return queue

    async def create_topic(self, name: str) -> Topic:
        """The topic ``name``: a durable topic exchange, declared if missing."""
        self._check_open()
        topic = Topic(name)
        await self._rpc(lambda: self._ensure_exchange(name))
        self._record(Declared.TOPIC, name)
        return topic

    def create_text_message(self, text: str = "") -> TextMessage:
        """A text message.

        Raises:
            MessageFormatError: ``text`` is not a str (also a TypeError).
        """
        return TextMessage(text)

    def create_bytes_message(self, data: bytes = b"") -> BytesMessage:
        """A bytes message.

        Raises:
            MessageFormatError: ``data`` is not bytes-like (also a TypeError).
        """
        return BytesMessage(data)

    # ---------------------------------------------------------- producers
    async def create_producer(
        self, destination: Destination | None = None, *, capacity: int | None = None
    ) -> MessageProducer:
        """A producer for ``destination`` (None: give one to each send).

        Raises:
            InvalidPropertyError: capacity below 1.
            InvalidDestinationError: not a Queue or Topic.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        if capacity is None:
            capacity = self._context.config.producer_capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidPropertyError("capacity", f"must be a whole number >= 1, got {capacity!r}")
        if destination is not None and not isinstance(destination, Queue | Topic):
            raise InvalidDestinationError(f"not a destination: {destination!r}")
        producer = MessageProducer(self._producer_context(), destination, capacity)
        channel = await self._rpc(lambda: self._producer_channel(producer))
        producer._attach(channel)
        self._producers.append(producer)
        self._context.register_producer(producer)
        return producer

    def _producer_context(self) -> ProducerContext:
        context = self._context
        return ProducerContext(
            config=context.config,
            clock=context.clock,
            usable=context.usable,
            wait_usable=context.wait_usable,
            report=context.report,
            closed=self._producer_closed,
        )

    def _consumer_context(self) -> ConsumerContext:
        context = self._context
        return ConsumerContext(
            started=context.started,
            report=context.report,
            flow_stats=context.flow_stats,
            flow_delivered=context.flow_delivered,
            to_message=self._to_message,
            processed=self._processed,
            closed=self._consumer_closed,
        )

    async def _producer_channel(self, producer: MessageProducer) -> AioChannel:
        channel = await self._context.open_channel(producer)
        await channel.confirm_select()
        return channel

    def _producer_closed(self, producer: MessageProducer) -> None:
        if producer in self._producers:
            self._producers.remove(producer)
        self._context.unregister_producer(producer)

    # ---------------------------------------------------------- consumers
    async def create_consumer(self, destination: Destination) -> MessageConsumer:
        """A consumer of a queue, or of a topic (a private, temporary subscription).

        Raises:
            InvalidDestinationError: the queue does not exist, or not a destination.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        if isinstance(destination, Queue):

            async def check() -> str:
                await (await self._admin()).queue_declare(destination.name, passive=True)
                return destination.name

            queue = await self._rpc(check)
        elif isinstance(destination, Topic):
            queue = await self._rpc(lambda: self._subscribe(destination, ""))
        else:
            raise InvalidDestinationError(f"not a destination: {destination!r}")
        consumer = MessageConsumer(self._consumer_context(), destination, queue, subscription=None)
        await self._start_consumer(consumer)
        return consumer

    async def create_durable_subscriber(self, topic: Topic, name: str) -> MessageConsumer:
        """A durable subscription ``name`` to ``topic``."""
        self._check_open()
        if not isinstance(topic, Topic):
            raise InvalidDestinationError(f"durable subscribers need a Topic, got {topic!r}")
        Queue(name)
        queue = await self._rpc(lambda: self._subscribe(topic, name))
        self._record(Declared.SUBSCRIPTION, topic.name, name)
        consumer = MessageConsumer(self._consumer_context(), topic, queue, subscription=name)
        await self._start_consumer(consumer)
        return consumer

    async def _subscribe(self, topic: Topic, name: str) -> str:
        await self._ensure_exchange(topic.exchange)
        admin = await self._admin()
        if name:
            queue, _, _ = await admin.queue_declare(name, durable=True)
        else:
            queue, _, _ = await admin.queue_declare(
                "", durable=False, exclusive=True, auto_delete=True
            )
        await admin.queue_bind(queue, topic.exchange, "#")
        return queue

    async def _start_consumer(self, consumer: MessageConsumer) -> None:
        channel = await self._rpc(lambda: self._context.open_channel(consumer))
        consumer._attach(channel)
        self._consumers.append(consumer)
        self._context.register_consumer(consumer, self.acknowledge_mode == CLIENT_ACKNOWLEDGE)

    async def _consumer_closed(self, consumer: MessageConsumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)
        channel = consumer._channel
        self._context.unregister_consumer(consumer)
        if channel is not None:
            await channel.close()  # returns every unacked message to the queue

    def _processed(self, consumer: MessageConsumer, generation: int, delivery: Delivery) -> None:
        if generation == consumer._generation:
            self._context.flow_processed(consumer.id, delivery.delivery_tag)

    def _to_message(
        self, consumer: MessageConsumer, generation: int, delivery: Delivery
    ) -> Message:
        """The application's message for a buffered delivery (of the consumer's
        channel number ``generation``).

        Raises:
            MessageFormatError: a text body that cannot be decoded.
        """
        acknowledger = None
        if self.acknowledge_mode == CLIENT_ACKNOWLEDGE:
            acknowledger = functools.partial(self._acknowledge_message, consumer, generation)
        return delivered_message(delivery, consumer.destination, acknowledger)

    def _acknowledge_message(self, consumer: MessageConsumer, generation: int) -> None:
        """``Message.acknowledge()``: refused for a message whose channel is gone.

        Raises:
            StaleMessageError: the message came on a channel lost since.
            IllegalStateError: the session is closed.
        """
        check_current(generation, consumer._generation)
        self.acknowledge()

    def acknowledge(self) -> None:
        """Acknowledge every message consumed by this session (CLIENT_ACKNOWLEDGE)."""
        self._check_open()
        if self.acknowledge_mode != CLIENT_ACKNOWLEDGE:
            return
        for consumer in list(self._consumers):
            self._context.flow_acknowledged(consumer.id)

    async def recover(self) -> None:
        """Redeliver every unacknowledged message of this session: each
        consumer gets a new channel (closing the old one returns its
        unacknowledged messages to the queue) and fresh flow accounting.

        Raises:
            IllegalStateError: the session is closed.
        """
        self._check_open()
        for consumer in list(self._consumers):
            old = consumer._channel
            if old is not None:
                await old.close()
            channel = await self._rpc(functools.partial(self._context.open_channel, consumer))
            consumer._attach(channel)
            self._context.reset_consumer_flow(consumer)

    async def unsubscribe(self, name: str) -> None:
        """Delete the durable subscription ``name`` (its queue).

        Raises:
            IllegalStateError: the session is closed.
            BrokerError: the broker refused.
        """
        self._check_open()

        async def delete() -> None:
            await (await self._admin()).queue_delete(name)

        await self._rpc(delete)
        self._declared.forget_subscription(name)

    # ------------------------------------------------------------- close
    async def close(self) -> None:
        """Close producers (waiting for their confirms) and consumers (idempotent).

        Raises:
            UnconfirmedMessagesError: a producer could not get its sends confirmed.
        """
        if self._closed:
            return
        errors: list[JMSException] = []
        for producer in list(self._producers):
            try:
                await producer.close()
            except JMSException as exc:
                errors.append(exc)
        for consumer in list(self._consumers):
            await consumer.close()
        self._closed = True
        admin, self._admin_channel = self._admin_channel, None
        if admin is not None:
            await admin.close()
        self._context.closed(self)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _restore(self) -> None:
        """Re-declare what this session declared and re-open its channels."""
        self._admin_channel = None
        for item in self._declared.snapshot():
            if item.kind is Declared.QUEUE:
                await self._ensure_queue(item.name)
            elif item.kind is Declared.TOPIC:
                await self._ensure_exchange(item.name)
            else:
                await self._subscribe(Topic(item.name), item.subscription)
        for producer in list(self._producers):
            producer._attach(await self._producer_channel(producer))
        for consumer in list(self._consumers):
            if consumer.is_topic and consumer.subscription is None:
                consumer._queue = await self._subscribe(Topic(consumer.destination.name), "")
            consumer._attach(await self._context.open_channel(consumer))
            self._context.reset_consumer_flow(consumer)
