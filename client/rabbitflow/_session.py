"""Session: destinations, producers, consumers, acknowledgement, transactions."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ._connection_core import ConsumerFlowBook
from ._consumer import ConsumerContext, MessageConsumer, open_consumer
from ._destination import Destination, Queue, Topic
from ._exceptions import (
    ConnectionLostError,
    IllegalStateError,
    InvalidDestinationError,
    JMSException,
    TransactionRolledBackError,
)
from ._producer import MessageProducer, ProducerContext, SessionProducerControl, open_producer
from ._producer_core import ProducerControl, check_capacity
from ._properties import ClientConfig
from ._session_admin import SessionAdmin
from ._session_core import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    SESSION_TRANSACTED,
    ConsumerControl,
    Declarations,
    Declared,
    Deliveries,
    MessageFactory,
    check_acknowledge_mode,
)
from ._session_retry import ATTEMPTS, SessionRetry
from ._session_tx import Transaction, sent_counts
from ._transport_base import ChannelHandler
from ._transport_channel import TransportChannel

__all__ = ["ConnectionControl", "Session", "SessionContext", "open_session"]

_MODES = {AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE, SESSION_TRANSACTED}


class ConnectionControl(Protocol):
    """The application's view of a session's connection."""

    def start(self) -> None:
        """Start (or resume) delivery to consumers."""

    def stop(self) -> None:
        """Pause delivery to consumers."""

    def close(self) -> None:
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
    wait: Callable[[threading.Condition, float], None]  # a condition wait (a test seam)
    pumps_pending: set[int]  # ids of producers whose pump is posted and has not run
    wait_usable: Callable[[], None]  # return when the connection is open
    recovering_or_lost: Callable[[], bool]
    # wait_usable, then the generation of the transport in use (see
    # register_producer), read with that check
    usable_transport: Callable[[], int]
    # a channel opened on that transport is still on the one in use, and open
    holds: Callable[[int], bool]
    open_channel: Callable[[ChannelHandler], TransportChannel]
    post: Callable[[Callable[[], None]], None]  # run on the I/O thread
    call_later: Callable[[float, Callable[[], None]], None]  # on the I/O thread
    report: Callable[[JMSException], None]  # to the exception listener
    started: Callable[[], bool]  # delivery to consumers is on
    # a new producer, its channel opened on that transport: False when stale
    register_producer: Callable[[ProducerControl[TransportChannel], int], bool]
    unregister_producer: Callable[[ProducerControl[TransportChannel]], None]
    # a new consumer (app_acks: the application acknowledges), its channel
    # opened on that transport: False when stale, else it starts consuming
    register_consumer: Callable[[ConsumerControl[TransportChannel], bool, int], bool]
    flow: ConsumerFlowBook  # the consumers' flow accounting
    closed: Callable[[Session], None]  # the session closed


class Session(MessageFactory):
    """A unit of work: creates destinations, producers, consumers and messages.

    Non-transacted sessions give every producer its own confirm-mode channel
    and every consumer its own channel; a transacted session puts all of
    them in tx mode and ``commit()`` commits each.  Usable from several
    threads.
    """

    def __init__(self, context: SessionContext, transacted: bool, acknowledge_mode: int) -> None:
        check_acknowledge_mode(acknowledge_mode, _MODES)
        self._context = context
        #: The connection that created this session.
        self.connection = context.connection
        self.transacted = bool(transacted) or acknowledge_mode == SESSION_TRANSACTED
        self.acknowledge_mode = SESSION_TRANSACTED if self.transacted else acknowledge_mode
        self._lock = threading.RLock()
        self._retry = SessionRetry(context, self._lock)
        self._admin = SessionAdmin(context.open_channel)
        self._producers: dict[MessageProducer, SessionProducerControl] = {}
        self._consumers: dict[ConsumerControl[TransportChannel], MessageConsumer] = {}
        self._deliveries = Deliveries(
            self.acknowledge_mode, self.acknowledge, context.flow.processed
        )
        self._declared = Declarations()
        self._channels: dict[int, TransportChannel] = {}  # consumer id -> channel
        self._producer_channels: dict[str, TransportChannel] = {}
        self._tx = Transaction()
        self._closed = False

    # ------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("session is closed")

    def _record(self, kind: Declared, name: str, subscription: str = "") -> None:
        with self._lock:
            self._declared.record(kind, name, subscription)

    # ------------------------------------------------------- destinations
    def create_queue(self, name: str) -> Queue:
        """The queue ``name``; declared (durable, no arguments) only if missing.

        An existing queue is used as it is, whatever its arguments.

        Raises:
            InvalidDestinationError: bad name.
            BrokerError: the broker refused (e.g. access).
            IllegalStateError: the session is closed.
        """
        self._check_open()
        queue = Queue(name)
        self._retry.rpc(lambda: self._admin.ensure_queue(name))
        self._record(Declared.QUEUE, name)
        return queue

    def create_topic(self, name: str) -> Topic:
        """The topic ``name``: a durable topic exchange, declared if missing.

        Raises:
            InvalidDestinationError: bad name.
            BrokerError: an exchange ``name`` exists with another type.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        topic = Topic(name)
        self._retry.rpc(lambda: self._admin.ensure_exchange(name))
        self._record(Declared.TOPIC, name)
        return topic

    # ---------------------------------------------------------- producers
    def create_producer(
        self, destination: Destination | None = None, *, capacity: int | None = None
    ) -> MessageProducer:
        """A producer for ``destination`` (None: give one to each send).

        ``capacity`` defaults to ``rabbitflow.producer_capacity``.

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

        def take_in(opened_on: int, channel: TransportChannel) -> bool:
            control.attach(channel)
            if self._context.register_producer(control, opened_on):
                self._producers[producer] = control
                return True
            del self._producer_channels[producer.id]  # stale
            return False

        self._retry.on_one_transport(lambda: self._producer_channel(producer), take_in)
        return producer

    def _producer_context(self) -> ProducerContext:
        context = self._context
        return ProducerContext(
            config=context.config,
            clock=context.clock,
            wait=context.wait,
            pumps_pending=context.pumps_pending,
            transacted=self.transacted,
            wait_usable=context.wait_usable,
            post=context.post,
            call_later=context.call_later,
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

    def _producer_channel(self, producer: MessageProducer) -> TransportChannel:
        channel = self._context.open_channel(producer)
        if self.transacted:
            channel.tx_select()
        else:
            channel.confirm_select()
        with self._lock:
            self._producer_channels[producer.id] = channel
        return channel

    def _producer_closed(self, producer: MessageProducer) -> None:
        with self._lock:
            control = self._producers.pop(producer, None)
            channel = self._producer_channels.pop(producer.id, None)
        if control is not None:
            self._context.unregister_producer(control)
        if channel is not None and self.transacted:
            channel.close()

    # ---------------------------------------------------------- consumers
    def create_consumer(self, destination: Destination) -> MessageConsumer:
        """A consumer of a queue, or of a topic (a private, temporary subscription).

        Raises:
            InvalidDestinationError: the queue does not exist, or not a destination.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        if isinstance(destination, Queue):
            self._retry.rpc(lambda: self._admin.check_queue(destination.name))
            queue = destination.name
        elif isinstance(destination, Topic):
            queue = ""  # its private subscription's, declared with its channel
        else:
            raise InvalidDestinationError(f"not a destination: {destination!r}")
        return self._start_consumer(*open_consumer(self._consumer_context(), destination, queue))

    def create_durable_subscriber(self, topic: Topic, name: str) -> MessageConsumer:
        """A durable subscription ``name`` to ``topic``: the durable queue ``name``
        bound to the topic's exchange; it keeps messages while no one consumes.

        Raises:
            InvalidDestinationError: ``topic`` is not a Topic or ``name`` is bad.
            IllegalStateError: the session is closed.
        """
        self._check_open()
        if not isinstance(topic, Topic):
            raise InvalidDestinationError(f"durable subscribers need a Topic, got {topic!r}")
        Queue(name)  # validates the name
        queue = self._retry.rpc(lambda: self._admin.subscribe(topic, name))
        self._record(Declared.SUBSCRIPTION, topic.name, name)
        return self._start_consumer(
            *open_consumer(self._consumer_context(), topic, queue, subscription=name)
        )

    def unsubscribe(self, name: str) -> None:
        """Delete the durable subscription ``name`` (its queue).

        Raises:
            BrokerError: the broker refused.
        """
        self._check_open()
        self._retry.rpc(lambda: self._admin.delete_queue(name))
        with self._lock:
            self._declared.forget_subscription(name)

    def _start_consumer(
        self, consumer: MessageConsumer, control: ConsumerControl[TransportChannel]
    ) -> MessageConsumer:
        """Give a new consumer its channel and register it, which starts it
        consuming, on one transport (``SessionRetry.on_one_transport``)."""
        app_acks = self.transacted or self.acknowledge_mode == CLIENT_ACKNOWLEDGE

        def take_in(opened_on: int, channel: TransportChannel) -> bool:
            control.attach(channel)
            if self._context.register_consumer(control, app_acks, opened_on):
                self._consumers[control] = consumer
                self._channels[consumer.id] = channel
                return True
            return False

        def stale() -> None:
            # Its private queue (declared on the transport in use, maybe a
            # newer one than the channel's) would collect the topic's messages.
            if consumer.is_topic and consumer.subscription is None:
                with contextlib.suppress(JMSException):  # else it went with its transport
                    self._admin.delete_queue(consumer.queue_name)

        open_channel = functools.partial(self._new_consumer_channel, consumer, control)
        self._retry.on_one_transport(open_channel, take_in, stale)
        return consumer

    def _new_consumer_channel(
        self, consumer: MessageConsumer, control: ConsumerControl[TransportChannel]
    ) -> TransportChannel:
        """The consumer's channel on a transport it had none on; a private
        subscription to a topic gets its queue there first (exclusive, the
        one it had went with its transport)."""
        if consumer.is_topic and consumer.subscription is None:
            control.resubscribed(self._admin.subscribe(Topic(consumer.destination.name), ""))
        return self._consumer_channel(consumer)

    def _consumer_channel(self, consumer: MessageConsumer) -> TransportChannel:
        """A new channel for the consumer; who attaches it records it."""
        channel = self._context.open_channel(consumer)
        if self.transacted:
            channel.tx_select()
        return channel

    def _consumer_closed(self, consumer: ConsumerControl[TransportChannel], dropped: int) -> None:
        with self._lock:
            self._consumers.pop(consumer, None)
            channel = self._channels.pop(consumer.id, None)
        self._context.flow.unregister(consumer.id)
        if channel is not None:
            # Closing the channel returns every unacked message to the queue.
            channel.close()

    # ---------------------------------------------------- acknowledgement
    def acknowledge(self) -> None:
        """Acknowledge every message consumed by this session (CLIENT_ACKNOWLEDGE).

        Raises:
            IllegalStateError: the session is closed.
        """
        self._check_open()
        if self.acknowledge_mode != CLIENT_ACKNOWLEDGE:
            return
        with self._lock:
            consumers = list(self._consumers)
        for consumer in consumers:
            self._context.flow.acknowledged(consumer.id)

    def recover(self) -> None:
        """Redeliver every unacknowledged message of this session.

        Raises:
            IllegalStateError: the session is closed or transacted.
        """
        self._check_open()
        if self.transacted:
            raise IllegalStateError("recover() on a transacted session: use rollback()")
        self._restart_consumers(rollback=False)

    def commit(self) -> None:
        """Commit the messages sent and received in this transaction.

        Waits until each producer has published what it accepted (as a send
        waits under flow control), then returns once the broker answered
        tx.commit-ok (a flow-controlling gateway holds it while the queues
        are over their threshold).

        Raises:
            IllegalStateError: not a transacted session, or closed.
            TransactionRolledBackError: the connection was lost during the
                transaction; its work was rolled back, including what was
                sent after the reconnection, so a retry of the whole
                transaction sends each message once.
            FlowControlTimeoutError: flow control held a message sent in
                the transaction back for ``qpid.flow_control_wait_failure``
                ms; nothing was committed and the transaction stays open
                (commit again, or roll back).
            JMSException: the broker closed a producer's channel.
        """
        self._check_open()
        if not self.transacted:
            raise IllegalStateError("commit() on a non-transacted session")
        self._whole_transaction()
        with self._lock:
            producers = list(self._producers.values())
        try:
            for producer in producers:  # tx.commit must cover what they accepted
                producer.flush()
            consumers, channels = self._whole_transaction()  # a loss while they published
            for consumer in consumers:
                self._context.flow.acknowledged(consumer.id)
            for channel in channels:
                channel.tx_commit()
        except ConnectionLostError as exc:  # the connection failed: nothing survives
            with contextlib.suppress(JMSException):  # told now: no recovery's mark fails the next
                self.rollback()
            raise TransactionRolledBackError(f"commit failed: {exc}") from exc

    def _whole_transaction(
        self,
    ) -> tuple[list[ConsumerControl[TransportChannel]], list[TransportChannel]]:
        """The consumers and the channels of a transaction no connection loss
        broke (taken with that answer: a restore replaces the channels after
        it marks the transaction broken, so a later loss fails their commit).

        Raises:
            TransactionRolledBackError: a loss broke it; it was rolled back.
        """
        with self._lock:
            broken = self._tx.broken
            consumers = list(self._consumers)
            channels = [*self._producer_channels.values(), *self._channels.values()]
        if broken:
            self.rollback()
            raise TransactionRolledBackError(
                "the connection was lost during the transaction; it was rolled back"
            )
        return consumers, channels

    def rollback(self) -> None:
        """Discard messages sent and redeliver messages received in this transaction.

        Messages sent and not yet published (held back by flow control, or
        not yet handed to the I/O thread) are dropped too.  A connection loss
        meanwhile does not fail it: it runs again on the channels the
        recovery gave (``Transaction``: when the next one is whole).

        Raises:
            IllegalStateError: not a transacted session, or closed.
            ConnectionLostError: the connection kept failing.
        """
        self._check_open()
        if not self.transacted:
            raise IllegalStateError("rollback() on a non-transacted session")
        with self._lock:
            self._tx.rollback_started()
            sent = sent_counts(self._producers)
        for _ in range(ATTEMPTS):
            ran_on = self._roll_back_once()
            with self._lock:  # a restore marks the transaction broken under it
                if ran_on is not None and self._context.holds(ran_on):
                    self._tx.rolled_back(sent, sent_counts(self._producers))
                    return
        raise ConnectionLostError("connection kept failing during the rollback")

    def _roll_back_once(self) -> int | None:
        """Drop each producer's unpublished messages, roll back its channel and
        restart each consumer: the generation of the transport that ran on,
        None when a loss stopped it.

        Dropped first: a pump that took some before publishes them ahead of
        the tx.rollback (one I/O thread, in order), and none publishes any
        after it."""
        ran_on = self._retry.usable_transport()
        with self._lock:
            producers = list(self._producers.values())
            channels = list(self._producer_channels.values())
        for producer in producers:
            producer.discard()
        try:
            for channel in channels:
                channel.tx_rollback()
        except JMSException:  # a dead channel: lost, or closed with its connection
            if not self._retry.lost_since(ran_on):
                raise
            return None
        self._restart_consumers(rollback=True)
        return ran_on

    def _restart_consumers(self, *, rollback: bool) -> None:
        with self._lock:
            consumers = list(self._consumers.items())
        for control, consumer in consumers:
            self._restart_consumer(consumer, control, rollback=rollback)

    def _restart_consumer(
        self,
        consumer: MessageConsumer,
        control: ConsumerControl[TransportChannel],
        *,
        rollback: bool,
    ) -> None:
        """Redeliver the consumer's unacked messages: new channel, fresh accounting.

        Closing the old channel requeues everything it had unacked, and no
        stale delivery can reach the new one.  The new one is attached on one
        transport (``SessionRetry.on_one_transport``): after a loss in between, the old
        one is the channel that the restore gave the consumer.
        """

        def reopen() -> TransportChannel:
            with self._lock:
                old = self._channels.get(consumer.id)
            if old is not None:
                if rollback:
                    # Closing the channel discards the transaction anyway.
                    with contextlib.suppress(JMSException):
                        old.tx_rollback()
                old.close()
            return self._consumer_channel(consumer)

        def take_in(opened_on: int, channel: TransportChannel) -> bool:
            if not self._context.holds(opened_on):
                return False
            self._channels[consumer.id] = channel
            control.attach(channel)
            self._context.flow.reset(control.id)
            return True

        self._retry.on_one_transport(reopen, take_in)

    # ------------------------------------------------------------- close
    def close(self) -> None:
        """Close producers (waiting for their confirms) and consumers (idempotent).

        A transacted session's open transaction is rolled back.

        Raises:
            JMSException: a producer could not get its sends confirmed.
        """
        if self._closed:
            return
        with self._lock:
            producers = list(self._producers)
            consumers = list(self._consumers.values())
        errors: list[JMSException] = []
        for producer in producers:
            try:
                producer.close()
            except JMSException as exc:
                errors.append(exc)
        for consumer in consumers:
            consumer.close()
        self._closed = True
        self._admin.close()
        self._context.closed(self)
        if errors:
            raise errors[0]

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ recovery
    def _restore(self) -> None:
        """Re-declare what this session declared and re-open its channels on a
        new connection (called by the connection's recovery thread).

        Raises:
            JMSException: the new connection failed too (recovery retries).
        """
        self._admin.forget()
        with self._lock:
            declarations = list(
                self._declared.replay(
                    queue=self._admin.ensure_queue,
                    topic=self._admin.ensure_exchange,
                    subscription=self._admin.subscribe,
                )
            )
            producers = list(self._producers.items())
            consumers = list(self._consumers.items())
            if self.transacted:
                self._tx.lost()
        for declare in declarations:
            declare()
        for producer, producer_control in producers:
            producer_control.attach(self._producer_channel(producer))
        for control, consumer in consumers:
            channel = self._new_consumer_channel(consumer, control)
            with self._lock:
                self._channels[consumer.id] = channel
            control.attach(channel)
            self._context.flow.reset(control.id)


def open_session(
    context: SessionContext, transacted: bool, acknowledge_mode: int
) -> tuple[Session, Callable[[], None]]:
    """A new session, and how its connection restores it on a new transport
    (re-declare what it declared, re-open its channels; raises JMSException
    when that transport fails too)."""
    session = Session(context, transacted, acknowledge_mode)
    return session, session._restore
