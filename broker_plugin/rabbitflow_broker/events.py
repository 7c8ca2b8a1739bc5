"""The gateway's operational events, Broker-J style.

Every event the gateway logs is one frozen dataclass here.  The console
line, the JSON record of the event log, the admin API and the pipeline's
Spark schema are all derived from these classes, so the formats cannot
drift apart:

* :meth:`Event.line` gives ``<subject> <code> : <message>``;
* :meth:`Event.to_record` gives the JSON-able record (``ts``, ``code``,
  ``subject``, ``message``, ``vhost`` and the event's own fields);
* :func:`record_fields` lists the typed fields of every event class, from
  which ``rabbitflow_pipeline.schemas`` builds its ``StructType``.

The module is pure: no clock reads, no logging, no I/O.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any, ClassVar, get_type_hints

__all__ = [
    "ALL_QUEUES",
    "EVENT_TYPES",
    "ChannelClosed",
    "ChannelEvent",
    "ChannelFlowEnforced",
    "ChannelFlowIgnored",
    "ChannelFlowRemoved",
    "ConnectionClosed",
    "ConnectionEvent",
    "Event",
    "QueueEvent",
    "QueueOverfull",
    "QueueUnderfull",
    "StoreEvent",
    "StoreOverfull",
    "StoreUnderfull",
    "event_from_record",
    "format_number",
    "record_fields",
]

#: Queue name printed in CHN-1005 when the whole store (or an administrator)
#: blocks a channel rather than one queue.
ALL_QUEUES = "** All Queues **"


def format_number(value: int) -> str:
    """Format an integer with thousands separators, like Broker-J (1,200)."""
    return f"{value:,}"


def _vhost_path(vhost: str) -> str:
    # Broker-J's spelling, the same in every subject: vhost "/" prints "/",
    # any other vhost "name" prints "/name".
    return vhost if vhost.startswith("/") else "/" + vhost


def _iso(ts: dt.datetime) -> str:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events: when it happened and in which virtual host."""

    code: ClassVar[str] = ""
    ts: dt.datetime
    vhost: str

    @property
    def subject(self) -> str:
        """The Broker-J subject in brackets, e.g. ``[vh(/)/qu(orders)]``.

        The vhost is spelt as Broker-J does: ``/`` for "/", ``/billing``
        for "billing" (``[vh(/billing)/qu(orders)]``), in every subject.
        """
        raise NotImplementedError

    @property
    def message(self) -> str:
        """The event text after the code."""
        raise NotImplementedError

    def line(self) -> str:
        """The human line: ``<subject> <code> : <message>``."""
        return f"{self.subject} {self.code} : {self.message}"

    def to_record(self) -> dict[str, Any]:
        """The JSON-able record written to the event log (one line each)."""
        record: dict[str, Any] = {
            "ts": _iso(self.ts),
            "code": self.code,
            "subject": self.subject,
            "message": self.message,
        }
        for field in dataclasses.fields(self):
            if field.name == "ts":
                continue
            record[field.name] = getattr(self, field.name)
        return record


@dataclass(frozen=True, kw_only=True)
class QueueEvent(Event):
    """An event about one queue."""

    queue: str

    @property
    def subject(self) -> str:
        return f"[vh({_vhost_path(self.vhost)})/qu({self.queue})]"


@dataclass(frozen=True, kw_only=True)
class QueueOverfull(QueueEvent):
    """QUE-1003: the queue went over a flow-stop threshold (flow ON)."""

    code: ClassVar[str] = "QUE-1003"
    size: int
    capacity: int  # flow stop size, 0 when not set
    messages: int
    message_capacity: int  # flow stop count, 0 when not set

    @property
    def message(self) -> str:
        return (
            f"Overfull : Size : {format_number(self.size)} bytes, "
            f"Capacity : {format_number(self.capacity)}, "
            f"Messages : {format_number(self.messages)}, "
            f"Message Capacity : {format_number(self.message_capacity)}"
        )


@dataclass(frozen=True, kw_only=True)
class QueueUnderfull(QueueEvent):
    """QUE-1004: the queue fell below its resume thresholds (flow OFF)."""

    code: ClassVar[str] = "QUE-1004"
    size: int
    resume_capacity: int  # flow resume size, 0 when not set
    messages: int
    message_capacity: int  # flow resume count, 0 when not set

    @property
    def message(self) -> str:
        return (
            f"Underfull : Size : {format_number(self.size)} bytes, "
            f"Resume Capacity : {format_number(self.resume_capacity)}, "
            f"Messages : {format_number(self.messages)}, "
            f"Message Capacity : {format_number(self.message_capacity)}"
        )


@dataclass(frozen=True, kw_only=True)
class ChannelEvent(Event):
    """An event about one client channel of one gateway connection."""

    connection: int  # the gateway's connection number
    user: str
    remote_host: str
    remote_port: int
    channel: int

    @property
    def subject(self) -> str:
        return (
            f"[con:{self.connection}({self.user}@{self.remote_host}:{self.remote_port}"
            f"{_vhost_path(self.vhost)})/ch:{self.channel}]"
        )


@dataclass(frozen=True, kw_only=True)
class ChannelFlowEnforced(ChannelEvent):
    """CHN-1005: the channel was sent ``Channel.Flow(active=false)``."""

    code: ClassVar[str] = "CHN-1005"
    queue: str  # the queue that blocked it, or ALL_QUEUES

    @property
    def message(self) -> str:
        return f"Flow Control Enforced (Queue {self.queue})"


@dataclass(frozen=True, kw_only=True)
class ChannelFlowRemoved(ChannelEvent):
    """CHN-1006: the channel was sent ``Channel.Flow(active=true)``."""

    code: ClassVar[str] = "CHN-1006"

    @property
    def message(self) -> str:
        return "Flow Control Removed"


@dataclass(frozen=True, kw_only=True)
class ChannelFlowIgnored(ChannelEvent):
    """CHN-1012: the channel kept publishing while flowed; it is closed."""

    code: ClassVar[str] = "CHN-1012"

    @property
    def message(self) -> str:
        return "Flow Control Ignored. Channel will be closed."


@dataclass(frozen=True, kw_only=True)
class ChannelClosed(ChannelEvent):
    """CHN-1003: a channel that was ever flowed closed, for any reason."""

    code: ClassVar[str] = "CHN-1003"

    @property
    def message(self) -> str:
        return "Close"


@dataclass(frozen=True, kw_only=True)
class ConnectionEvent(Event):
    """An event about one client connection of the gateway."""

    connection: int  # the gateway's connection number
    user: str
    remote_host: str
    remote_port: int

    @property
    def subject(self) -> str:
        return (
            f"[con:{self.connection}({self.user}@{self.remote_host}:{self.remote_port}"
            f"{_vhost_path(self.vhost)})]"
        )


@dataclass(frozen=True, kw_only=True)
class ConnectionClosed(ConnectionEvent):
    """CON-1002: a client connection that had logged in closed."""

    code: ClassVar[str] = "CON-1002"

    @property
    def message(self) -> str:
        return "Close"


@dataclass(frozen=True, kw_only=True)
class StoreEvent(Event):
    """An event about a virtual host's message store."""

    store: str = "RabbitMQ"
    size: int
    overfull_size: int
    underfull_size: int

    @property
    def subject(self) -> str:
        return f"[vh({_vhost_path(self.vhost)})/ms({self.store})]"


@dataclass(frozen=True, kw_only=True)
class StoreOverfull(StoreEvent):
    """MST-1008: the store exceeded ``--store-overfull-size``."""

    code: ClassVar[str] = "MST-1008"

    @property
    def message(self) -> str:
        return "Store overfull, flow control will be enforced"


@dataclass(frozen=True, kw_only=True)
class StoreUnderfull(StoreEvent):
    """MST-1009: the store fell below ``--store-underfull-size``."""

    code: ClassVar[str] = "MST-1009"

    @property
    def message(self) -> str:
        return "Store overfull condition cleared"


#: Every concrete event class by its code.
EVENT_TYPES: dict[str, type[Event]] = {
    cls.code: cls
    for cls in (
        QueueOverfull,
        QueueUnderfull,
        ChannelFlowEnforced,
        ChannelFlowRemoved,
        ChannelFlowIgnored,
        ChannelClosed,
        ConnectionClosed,
        StoreOverfull,
        StoreUnderfull,
    )
}


def record_fields() -> dict[str, type]:
    """Every field any event record can carry, with its Python type.

    ``ts`` is a :class:`datetime.datetime`; ``code``, ``subject`` and
    ``message`` are strings; the rest come from the event classes.  A field
    that two classes share has the same type in both.
    """
    fields: dict[str, type] = {"ts": dt.datetime, "code": str, "subject": str, "message": str}
    for cls in EVENT_TYPES.values():
        hints = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kind = hints[field.name]
            previous = fields.setdefault(field.name, kind)
            if previous is not kind:  # pragma: no cover - guarded by a unit test
                raise TypeError(f"event field {field.name!r} has two types")
    return fields


def event_from_record(record: dict[str, Any]) -> Event:
    """Rebuild an event from its JSON record (the inverse of ``to_record``).

    Raises:
        ValueError: unknown code, missing or mistyped field.
    """
    code = record.get("code")
    cls = EVENT_TYPES.get(str(code))
    if cls is None:
        raise ValueError(f"unknown event code {code!r}")
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in record:
            if field.default is not dataclasses.MISSING:
                continue
            raise ValueError(f"{code} record lacks field {field.name!r}")
        kwargs[field.name] = record[field.name]
    raw_ts = kwargs["ts"]
    if isinstance(raw_ts, str):
        kwargs["ts"] = dt.datetime.fromisoformat(raw_ts.replace("Z", "+00:00"))
    return cls(**kwargs)
