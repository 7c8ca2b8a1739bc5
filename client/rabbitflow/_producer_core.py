"""What the sync and the asyncio producer share, whatever drives them: the
checks and headers of a send, the log lines of flow control, the
publishes of a window step (re-sent ones flagged as redelivered), and the
control a session and a connection drive a producer through.

The state itself is the pure ``ProducerWindow`` of ``_flow``; the drivers
only wait their own way (a condition, a future) and call these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ._destination import Destination, Queue, Topic
from ._exceptions import (
    FlowControlTimeoutError,
    IllegalStateError,
    InvalidDestinationError,
    InvalidPropertyError,
    JMSException,
)
from ._flow import (
    ConnectionBlocked,
    ConnectionUnblocked,
    FlowEnforced,
    FlowRemoved,
    GateEvent,
    GateNotice,
    ProducerWindow,
    Publish,
    SendDelayed,
    SendFailed,
)
from ._log import get_logger
from ._message import (
    NON_PERSISTENT,
    PERSISTENT,
    Message,
    WireProperties,
    check_sendable,
    flagged_redelivered,
    new_message_id,
)

__all__ = [
    "FlowLog",
    "Outgoing",
    "ProducerControl",
    "ProducerCounters",
    "check_capacity",
    "log_notices",
    "log_wait",
    "outgoing",
    "stamp",
    "target_of",
    "timeout_error",
    "wire_items",
]

_log = get_logger()
_DELAYED = "Message send delayed by {seconds}s due to broker enforced flow control"
_FAILED = "Message send failed due to timeout waiting on broker enforced flow control"
_TIMEOUT = "Unable to send message for {seconds} seconds due to broker enforced flow control"
_ENFORCED = "Broker enforced flow control has been enforced"
_REMOVED = "Broker enforced flow control is no longer in effect"
_TTL_MAX = (1 << 63) - 1  # ms: JMS's timeToLive is a Java long

#: One publish: exchange, routing key, body, properties.
Outgoing = tuple[str, str, bytes, WireProperties]
ChannelT = TypeVar("ChannelT")


@dataclass(frozen=True, eq=False, slots=True)
class ProducerControl(Generic[ChannelT]):
    """A producer as its session and connection drive it (each driver's
    producer module builds one with the producer)."""

    attach: Callable[[ChannelT], None]  # publish on this (new) channel what is queued
    gate: Callable[[GateEvent, str], None]  # connection-wide: blocked (reason), unblocked
    lost: Callable[[], None]  # the connection was lost: re-send on the next channel
    failed: Callable[[JMSException], None]  # recovery gave up: sends raise this


def check_capacity(capacity: int | None, default: int) -> int:
    """A producer's window size: ``capacity``, else ``default`` (the
    ``rabbitflow.producer_capacity`` property).

    Raises:
        InvalidPropertyError: not a whole number of at least 1.
    """
    if capacity is None:
        capacity = default
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidPropertyError("capacity", f"must be a whole number >= 1, got {capacity!r}")
    return capacity


class ProducerCounters:
    """The read-only figures of a producer, from its window (both drivers)."""

    id: str
    _window: ProducerWindow[Outgoing]
    _destination: Destination | None

    @property
    def capacity(self) -> int:
        """Most messages this producer may have sent and not had confirmed."""
        return self._window.capacity

    @property
    def destination(self) -> Destination | None:
        """The producer's destination (None: given to each send)."""
        return self._destination

    @property
    def sent_count(self) -> int:
        """Messages accepted by send()."""
        return self._window.accepted_count

    @property
    def confirmed_count(self) -> int:
        """Messages the broker confirmed."""
        return self._window.confirmed_count

    @property
    def nacked_count(self) -> int:
        """Nacks received (each nacked message is re-sent in order)."""
        return self._window.nacked_count

    @property
    def resent_count(self) -> int:
        """Messages re-published after a connection loss (their confirm was lost;
        the broker may hold them twice, the second copy flagged redelivered)."""
        return self._window.resent_count

    @property
    def flow_state(self) -> str:
        """The gate state: open, flowed, blocked, flowed+blocked, disconnected,
        disconnected+blocked, closed."""
        return self._window.gate.state.value


class FlowLog:
    """A producer's flow control log lines, with its structured fields."""

    __slots__ = ("_destination", "_id", "_window")

    def __init__(
        self, producer_id: str, destination: Destination | None, window: ProducerWindow[Outgoing]
    ) -> None:
        self._id = producer_id
        self._destination = destination
        self._window = window

    def fields(self, target: Destination | None = None) -> dict[str, Any]:
        """The producer, its destination (or the send's ``target``) and capacity."""
        dest = target if target is not None else self._destination
        return {
            "producer": self._id,
            "destination": str(dest) if dest is not None else "",
            "capacity": self._window.capacity,
        }

    def wait(self, notice: SendDelayed | SendFailed, target: Destination | None) -> None:
        """A waiting send's "delayed" warning or its failure (``target``: the
        send's destination; None: the producer's, as for a commit's wait)."""
        log_wait(notice, self._window.wait_reason(), self.fields(target))

    def notices(self, notices: list[GateNotice]) -> None:
        """The gate's changes."""
        log_notices(notices, self.fields())


def target_of(
    producer_id: str, closed: bool, own: Destination | None, given: Destination | None
) -> Destination:
    """Where a send goes: the producer's destination, else the one given.

    Raises:
        IllegalStateError: the producer is closed.
        InvalidDestinationError: none, not a destination, or a second one.
    """
    if closed:
        raise IllegalStateError(f"{producer_id} is closed")
    if given is not None and not isinstance(given, Queue | Topic):
        raise InvalidDestinationError(f"not a destination: {given!r}")
    if own is not None:
        if given is not None and given != own:
            raise InvalidDestinationError(f"{producer_id} sends to {own}; cannot send to {given}")
        return own
    if given is None:
        raise InvalidDestinationError(f"{producer_id} has no destination: pass one to send()")
    return given


def stamp(
    message: Message, target: Destination, delivery_mode: int, priority: int, time_to_live: int
) -> None:
    """Check a send's arguments and its message, then set the message's JMS
    headers.  A message AMQP cannot carry is refused here, before the window
    accepts it: past that point it holds a delivery tag.

    Raises:
        InvalidPropertyError: bad delivery_mode, priority, time_to_live or message.
        MessageFormatError: a header or property AMQP cannot carry (see
            ``check_sendable``).
    """
    if delivery_mode not in (PERSISTENT, NON_PERSISTENT):
        raise InvalidPropertyError("delivery_mode", f"must be 1 or 2, got {delivery_mode!r}")
    if not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidPropertyError("priority", f"must be 0..9, got {priority!r}")
    if not isinstance(time_to_live, int) or not 0 <= time_to_live <= _TTL_MAX:
        raise InvalidPropertyError(
            "time_to_live", f"must be 0..{_TTL_MAX} ms, got {time_to_live!r}"
        )
    if not isinstance(message, Message):
        raise InvalidPropertyError("message", f"expected a Message, got {type(message).__name__}")
    check_sendable(message)
    now_ms = int(time.time() * 1000)
    message.message_id = new_message_id()
    message.timestamp = now_ms
    message.destination = target
    message.delivery_mode = delivery_mode
    message.priority = priority
    message.expiration = now_ms + time_to_live if time_to_live else 0


def outgoing(message: Message, target: Destination) -> Outgoing:
    """The publish of a stamped message."""
    return (target.exchange, target.routing_key, message.body_bytes(), message.to_wire())


def wire_items(publishes: list[Publish[Outgoing]]) -> list[Outgoing]:
    """The publishes of a window step, re-sent ones flagged as redelivered."""
    return [
        (p.item[0], p.item[1], p.item[2], flagged_redelivered(p.item[3])) if p.resent else p.item
        for p in publishes
    ]


def timeout_error(failed: SendFailed) -> FlowControlTimeoutError:
    """The error of a send that waited the whole wait-failure time."""
    seconds = failed.waited_ms / 1000
    text = f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))
    return FlowControlTimeoutError(_TIMEOUT.format(seconds=text))


def log_wait(notice: SendDelayed | SendFailed, reason: str, fields: dict[str, Any]) -> None:
    """Log a waiting send's "delayed" warning or its failure."""
    if isinstance(notice, SendDelayed):
        _log.warning(
            _DELAYED.format(seconds=notice.seconds),
            flow_event="send_delayed",
            waited_ms=notice.waited_ms,
            reason=reason,
            **fields,
        )
    else:
        _log.error(
            _FAILED, flow_event="send_failed", waited_ms=notice.waited_ms, reason=reason, **fields
        )


def log_notices(notices: list[GateNotice], fields: dict[str, Any]) -> None:
    """Log the gate's changes (flow enforced / removed, connection blocked / unblocked)."""
    for notice in notices:
        if isinstance(notice, FlowEnforced):
            _log.info(_ENFORCED, flow_event="flow_enforced", **fields)
        elif isinstance(notice, FlowRemoved):
            _log.info(_REMOVED, flow_event="flow_removed", **fields)
        elif isinstance(notice, ConnectionBlocked):
            _log.info(
                f"Broker blocked the connection: {notice.reason}",
                flow_event="connection_blocked",
                reason=notice.reason,
                **fields,
            )
        elif isinstance(notice, ConnectionUnblocked):
            _log.info(
                "Broker unblocked the connection", flow_event="connection_unblocked", **fields
            )
