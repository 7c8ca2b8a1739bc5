"""What the sync and the asyncio session share, whatever drives them: the
acknowledge modes, what a session declared (to declare again on recovery),
the handler of the admin channel, the control a session drives a consumer
through, and how a consumer's deliveries become the application's messages."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ._destination import Destination, Topic
from ._exceptions import InvalidPropertyError, JMSException, StaleMessageError
from ._message import BytesMessage, Message, TextMessage
from ._transport_base import Delivery

__all__ = [
    "AUTO_ACKNOWLEDGE",
    "CLIENT_ACKNOWLEDGE",
    "DUPS_OK_ACKNOWLEDGE",
    "SESSION_TRANSACTED",
    "AdminHandler",
    "ConsumerControl",
    "Declaration",
    "Declarations",
    "Declared",
    "Deliveries",
    "MessageFactory",
    "check_acknowledge_mode",
    "check_current",
    "delivered_message",
]

SESSION_TRANSACTED = 0
AUTO_ACKNOWLEDGE = 1
CLIENT_ACKNOWLEDGE = 2
DUPS_OK_ACKNOWLEDGE = 3

ChannelT = TypeVar("ChannelT")
R = TypeVar("R")


def check_acknowledge_mode(mode: int, allowed: set[int]) -> int:
    """A session's acknowledge mode, if it is one of ``allowed``.

    Raises:
        InvalidPropertyError: it is not.
    """
    if mode not in allowed:
        raise InvalidPropertyError(
            "acknowledge_mode", f"must be one of AUTO/CLIENT/DUPS_OK, got {mode!r}"
        )
    return mode


class MessageFactory:
    """The messages a session creates (both drivers' sessions)."""

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


@dataclass(frozen=True, eq=False, slots=True)
class ConsumerControl(Generic[ChannelT]):
    """A consumer as its session and connection drive it (each driver's
    consumer module builds one with the consumer)."""

    id: int
    destination: Destination
    queue_name: Callable[[], str]  # the AMQP queue consumed
    channel: Callable[[], ChannelT | None]  # the channel it consumes on (None: lost)
    generation: Callable[[], int]  # of that channel: older deliveries are stale
    attach: Callable[[ChannelT], None]  # consume on this (new) channel
    resubscribed: Callable[[str], None]  # a topic's new private queue (recovery)
    lost: Callable[[], None]  # the connection was lost: drop what its channel buffered
    failed: Callable[[JMSException], None]  # recovery gave up: receives raise this
    wake: Callable[[], None]  # the connection started: waiting receives look again


class AdminHandler:
    """Events of a session's admin channel (declarations only)."""

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Not in confirm mode."""

    def on_flow(self, active: bool) -> None:
        """Nothing is published on the admin channel."""

    def on_deliver(self, delivery: Delivery) -> None:
        """Nothing is consumed on the admin channel."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Nothing is published on the admin channel."""

    def on_channel_closed(self, error: JMSException) -> None:
        """A failed declaration closes it; the session opens another when needed."""


class Deliveries:
    """How a session hands its consumers' deliveries to the application: the
    message (with its acknowledger in CLIENT_ACKNOWLEDGE mode), and the flow
    accounting once one is processed, ignoring those of a channel lost since."""

    __slots__ = ("_acknowledge", "_client_acks", "_processed")

    def __init__(
        self,
        acknowledge_mode: int,
        acknowledge: Callable[[], None],
        processed: Callable[[int, int], None],
    ) -> None:
        self._client_acks = acknowledge_mode == CLIENT_ACKNOWLEDGE
        self._acknowledge = acknowledge  # the session's acknowledge()
        self._processed = processed  # (consumer id, delivery tag) to the flow accounting

    def to_message(
        self, consumer: ConsumerControl[Any], generation: int, delivery: Delivery
    ) -> Message:
        """The application's message for a buffered delivery (of the consumer's
        channel number ``generation``).

        Raises:
            MessageFormatError: a text body that cannot be decoded.
        """
        acknowledger = None
        if self._client_acks:
            acknowledger = functools.partial(self._acknowledge_message, consumer, generation)
        return delivered_message(delivery, consumer.destination, acknowledger)

    def processed(
        self, consumer: ConsumerControl[Any], generation: int, delivery: Delivery
    ) -> None:
        """The application is done with ``delivery`` (ack bookkeeping, refills)."""
        if generation == consumer.generation():
            self._processed(consumer.id, delivery.delivery_tag)

    def _acknowledge_message(self, consumer: ConsumerControl[Any], generation: int) -> None:
        """``Message.acknowledge()``: refused for a message whose channel is gone.

        Raises:
            StaleMessageError: the message came on a channel lost since.
            IllegalStateError: the session is closed.
        """
        check_current(generation, consumer.generation())
        self._acknowledge()


def delivered_message(
    delivery: Delivery, destination: Destination, acknowledger: Callable[[], None] | None
) -> Message:
    """The application's message for ``delivery``; ``acknowledger`` is what its
    ``acknowledge()`` calls (CLIENT_ACKNOWLEDGE sessions).

    Raises:
        MessageFormatError: a text body that cannot be decoded.
    """
    return Message.from_wire(
        delivery.body,
        delivery.properties,
        redelivered=delivery.redelivered,
        destination=destination,
        acknowledger=acknowledger,
    )


def check_current(generation: int, current: int) -> None:
    """Refuse to acknowledge a message of a channel lost since.

    Raises:
        StaleMessageError: ``generation`` is not the consumer's ``current`` one.
    """
    if generation != current:
        raise StaleMessageError(
            "cannot acknowledge: the message was delivered on a channel that was lost "
            "since (connection recovery); the broker delivers it again"
        )


class Declared(enum.Enum):
    """What a session declared."""

    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"  # a durable subscription: a queue bound to a topic


@dataclass(frozen=True, slots=True)
class Declaration:
    """One thing a session declared: a queue or a topic ``name``, or the
    durable subscription ``subscription`` to the topic ``name``."""

    kind: Declared
    name: str
    subscription: str = ""


class Declarations:
    """What a session declared, in order, each once: recovery declares them
    again on the new connection before anything is re-opened."""

    def __init__(self) -> None:
        self._items: list[Declaration] = []

    def record(self, kind: Declared, name: str, subscription: str = "") -> None:
        """Remember a declaration (again: no change)."""
        item = Declaration(kind, name, subscription)
        if item not in self._items:
            self._items.append(item)

    def forget_subscription(self, name: str) -> None:
        """The durable subscription ``name`` was deleted."""
        self._items = [d for d in self._items if d.subscription != name]

    def snapshot(self) -> list[Declaration]:
        """Every declaration, in the order made."""
        return list(self._items)

    def replay(
        self,
        *,
        queue: Callable[[str], R],
        topic: Callable[[str], R],
        subscription: Callable[[Topic, str], R],
    ) -> Iterator[Callable[[], R]]:
        """The calls that declare everything again, in the order made (the
        session calls or awaits each in turn)."""
        for item in self.snapshot():
            if item.kind is Declared.QUEUE:
                yield functools.partial(queue, item.name)
            elif item.kind is Declared.TOPIC:
                yield functools.partial(topic, item.name)
            else:
                yield functools.partial(subscription, Topic(item.name), item.subscription)
