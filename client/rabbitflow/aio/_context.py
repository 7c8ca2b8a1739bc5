"""What producers and consumers need from their session and connection: two
small interfaces, so neither reaches into the other objects' internals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._consumer_flow import ConsumerFlowStats
from .._exceptions import JMSException
from .._message import Message
from .._properties import ClientConfig
from .._transport_base import Delivery

if TYPE_CHECKING:
    from ._consumer import MessageConsumer
    from ._producer import MessageProducer

__all__ = ["ConsumerContext", "ProducerContext"]


@dataclass(frozen=True, slots=True)
class ProducerContext:
    """A producer's view of its connection and session."""

    config: ClientConfig
    clock: Callable[[], float]
    usable: Callable[[], bool]  # the connection is open (not recovering)
    wait_usable: Callable[[], Awaitable[None]]  # suspend until it is
    report: Callable[[JMSException], None]  # to the exception listener
    closed: Callable[[MessageProducer], None]  # the producer closed


@dataclass(frozen=True, slots=True)
class ConsumerContext:
    """A consumer's view of its connection and session."""

    started: Callable[[], bool]  # delivery to the application is on
    report: Callable[[JMSException], None]
    flow_stats: Callable[[int], ConsumerFlowStats]
    flow_delivered: Callable[[int], None]  # the broker delivered one message
    to_message: Callable[[MessageConsumer, int, Delivery], Message]
    processed: Callable[[MessageConsumer, int, Delivery], None]  # handed out
    closed: Callable[[MessageConsumer], Awaitable[None]]  # the consumer closed
