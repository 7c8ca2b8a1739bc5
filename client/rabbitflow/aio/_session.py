"""asyncio Session: destinations, producers, consumers, acknowledgement."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from .._connection_core import ConsumerFlowBook
from .._destination import Destination, Queue, Topic
from .._exceptions import (
    ConnectionLostError,
    IllegalStateError,
    InvalidDestinationError,
    JMSException,
)
from .._producer_core import ProducerControl, check_capacity
from .._properties import ClientConfig
from .._session_core import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    AdminHandler,
    ConsumerControl,
    Declarations,
    Declared,
    Deliveries,
    MessageFactory,
    check_acknowledge_mode,
)
from .._session_retry import ATTEMPTS, lost_since
from .._transport_base import ChannelHandler
from ._consumer import ConsumerContext, MessageConsumer, open_consumer
from ._producer import MessageProducer, ProducerContext, open_producer

if TYPE_CHECKING:
    from ._transport import AioChannel

__all__ = ["ConnectionControl", "Session", "SessionContext", "open_session"]

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
    transport_in_use: Callable[[], int]  # its generation (see register_producer)
    # a channel opened on that transport is still on the one in use, and open
    holds: Callable[[int], bool]
    open_channel: Callable[[ChannelHandler], Awaitable[AioChannel]]
    report: Callable[[JMSException], None]  # to the exception listener
    started: Callable[[], bool]  # delivery to consumers is on
    # a new producer, its channel opened on that transport: False when stale
    register_producer: Callable[[ProducerControl[AioChannel], int], bool]
    unregister_producer: Callable[[ProducerControl[AioChannel]], None]
    # a new consumer (app_acks: the application acknowledges), its channel
    # opened on that transport: False when stale, else it starts consuming
    register_consumer: Callable[[ConsumerControl[AioChannel], bool, int], bool]
    flow: ConsumerFlowBook  # the consumers' flow accounting
    closed: Callable[[Session], None]  # the session closed


class Session(MessageFactory):
    """Creates destinations, producers, consumers and messages on asyncio.

    Every producer has its own confirm-mode channel and every consumer its
    own channel.  Transacted sessions are not offered on asyncio.
    """

    def __init__(self, context: SessionContext, acknowledge_mode: int) -> None:
        check_acknowledge_mode(acknowledge_mode, _MODES)
        self._context = context
        #: The connection that created this session.
        self.connection = context.connection
        self.acknowledge_mode = acknowledge_mode
        self.transacted = False
        self._admin_channel: AioChannel | None = None
        self._producers: dict[MessageProducer, ProducerControl[AioChannel]] = {}
        self._consumers: dict[ConsumerControl[AioChannel], MessageConsumer] = {}
        self._deliveries = Deliveries(acknowledge_mode, self.acknowledge, context.flow.processed)
        self._declared = Declarations()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("session is closed")

    async def _rpc(self, fn: Callable[[], Awaitable[R]]) -> R:
        """Run a broker operation, riding out a connection recovery.

        Whether an error came from a loss is asked of the transport the
        attempt started on (:func:`~rabbitflow._session_retry.lost_since`).

        Raises:
            ConnectionLostError: recovery gave up, or the connection kept failing.
            IllegalStateError: the connection was closed.
            JMSException: the broker refused.
        """
        context = self._context
        for _ in range(ATTEMPTS):
            await context.wait_usable()
            started_on = context.transport_in_use()
            try:
                return await fn()
            except ConnectionLostError:
                if not lost_since(context, started_on):
                    raise
        raise ConnectionLostError("connection kept failing during the operation")

    async def _on_one_transport(
        self,
        open_channel: Callable[[], Awaitable[AioChannel]],
        take_in: Callable[[int, AioChannel], bool],
    ) -> None:
        """Attach a new channel to a producer or consumer (a new one, or one
        that recover() moves), on one transport.

        A recovery restores what the connection has registered and the
        session holds; after a loss while the channel was opened, its
        recovery leaves a new one out, or gives a moved one a channel that
        the stale one must not replace.  So ``take_in(opened_on, channel)``
        (no await between the channel's opening and it) attaches the channel
        only if the transport it was opened on is still in use and open (a
        new one's: if the connection registers it there); else (False) that
        channel is stale: open another.

        Raises:
            ConnectionLostError: the connection kept failing.
        """
        context = self._context

        async def opened() -> tuple[int, AioChannel]:
            opened_on = context.transport_in_use()
            return opened_on, await open_channel()

        for _ in range(ATTEMPTS):
            opened_on, channel = await self._rpc(opened)
            if take_in(opened_on, channel):
                return
            channel.detach()  # its late events must not reach the producer or consumer
            await channel.close()
        raise ConnectionLostError("connection kept failing while creating a producer or consumer")

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
        capacity = check_capacity(capacity, self._context.config.producer_capacity)
        if destination is not None and not isinstance(destination, Queue | Topic):
            raise InvalidDestinationError(f"not a destination: {destination!r}")
        producer, control = open_producer(self._producer_context(), destination, capacity)

        def take_in(opened_on: int, channel: AioChannel) -> bool:
            control.attach(channel)
            if self._context.register_producer(control, opened_on):
                self._producers[producer] = control
                return True
            return False

        open_channel = functools.partial(self._producer_channel, producer)
        await self._on_one_transport(open_channel, take_in)
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
            flow_stats=context.flow.stats,
            flow_delivered=context.flow.delivered,
            to_message=self._deliveries.to_message,
            processed=self._deliveries.processed,
            closed=self._consumer_closed,
        )

    async def _producer_channel(self, producer: MessageProducer) -> AioChannel:
        channel = await self._context.open_channel(producer)
        await channel.confirm_select()
        return channel

    def _producer_closed(self, producer: MessageProducer) -> None:
        control = self._producers.pop(producer, None)
        if control is not None:
            self._context.unregister_producer(control)

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
            queue = ""  # its private subscription's, declared with its channel
        else:
            raise InvalidDestinationError(f"not a destination: {destination!r}")
        return await self._start_consumer(
            *open_consumer(self._consumer_context(), destination, queue, subscription=None)
        )

    async def create_durable_subscriber(self, topic: Topic, name: str) -> MessageConsumer:
        """A durable subscription ``name`` to ``topic``."""
        self._check_open()
        if not isinstance(topic, Topic):
            raise InvalidDestinationError(f"durable subscribers need a Topic, got {topic!r}")
        Queue(name)
        queue = await self._rpc(lambda: self._subscribe(topic, name))
        self._record(Declared.SUBSCRIPTION, topic.name, name)
        return await self._start_consumer(
            *open_consumer(self._consumer_context(), topic, queue, subscription=name)
        )

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

    async def _start_consumer(
        self, consumer: MessageConsumer, control: ConsumerControl[AioChannel]
    ) -> MessageConsumer:
        """Give a new consumer its channel and register it, which starts it
        consuming, on one transport (``_on_one_transport``)."""
        app_acks = self.acknowledge_mode == CLIENT_ACKNOWLEDGE

        def take_in(opened_on: int, channel: AioChannel) -> bool:
            control.attach(channel)
            if self._context.register_consumer(control, app_acks, opened_on):
                self._consumers[control] = consumer
                return True
            return False

        open_channel = functools.partial(self._new_consumer_channel, consumer, control)
        await self._on_one_transport(open_channel, take_in)
        return consumer

    async def _new_consumer_channel(
        self, consumer: MessageConsumer, control: ConsumerControl[AioChannel]
    ) -> AioChannel:
        """The consumer's channel on a transport it had none on; a private
        subscription to a topic gets its queue there first (exclusive, the
        one it had went with its transport)."""
        if consumer.is_topic and consumer.subscription is None:
            control.resubscribed(await self._subscribe(Topic(consumer.destination.name), ""))
        return await self._context.open_channel(consumer)

    async def _consumer_closed(self, consumer: ConsumerControl[AioChannel]) -> None:
        self._consumers.pop(consumer, None)
        channel = consumer.channel()
        self._context.flow.unregister(consumer.id)
        if channel is not None:
            await channel.close()  # returns every unacked message to the queue

    def acknowledge(self) -> None:
        """Acknowledge every message consumed by this session (CLIENT_ACKNOWLEDGE)."""
        self._check_open()
        if self.acknowledge_mode != CLIENT_ACKNOWLEDGE:
            return
        for consumer in list(self._consumers):
            self._context.flow.acknowledged(consumer.id)

    async def recover(self) -> None:
        """Redeliver every unacknowledged message of this session: each
        consumer gets a new channel (closing the old one returns its
        unacknowledged messages to the queue) and fresh flow accounting.

        Raises:
            IllegalStateError: the session is closed.
        """
        self._check_open()
        for control, consumer in list(self._consumers.items()):
            await self._restart_consumer(consumer, control)

    async def _restart_consumer(
        self, consumer: MessageConsumer, control: ConsumerControl[AioChannel]
    ) -> None:
        """Close the consumer's channel, attach a new one on one transport
        (``_on_one_transport``: after a loss in between, the restore's
        channel is the one to close) and start its accounting afresh."""

        async def reopen() -> AioChannel:
            old = control.channel()
            if old is not None:
                await old.close()
            return await self._context.open_channel(consumer)

        def take_in(opened_on: int, channel: AioChannel) -> bool:
            if not self._context.holds(opened_on):
                return False
            control.attach(channel)
            self._context.flow.reset(control.id)
            return True

        await self._on_one_transport(reopen, take_in)

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
        for consumer in list(self._consumers.values()):
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
        for declare in self._declared.replay(
            queue=self._ensure_queue, topic=self._ensure_exchange, subscription=self._subscribe
        ):
            await declare()
        for producer, producer_control in list(self._producers.items()):
            producer_control.attach(await self._producer_channel(producer))
        for control, consumer in list(self._consumers.items()):
            control.attach(await self._new_consumer_channel(consumer, control))
            self._context.flow.reset(control.id)


def open_session(
    context: SessionContext, acknowledge_mode: int
) -> tuple[Session, Callable[[], Awaitable[None]]]:
    """A new session, and how its connection restores it on a new transport
    (re-declare what it declared, re-open its channels)."""
    session = Session(context, acknowledge_mode)
    return session, session._restore
