"""Explicit Spark schemas of the pipeline's inputs and outputs.

The gateway event schema is derived from the gateway's own event classes
(:func:`rabbitflow_broker.events.record_fields`), so a field added to an
event reaches the pipeline without anyone copying a field list.

Client log records are the SDK's structlog records rendered as JSON lines
by the application (``structlog.processors.JSONRenderer`` with an ISO
``TimeStamper``)::

    {"timestamp": "2026-11-22T05:00:00.123Z", "level": "warning",
     "logger": "rabbitflow.client",
     "event": "Message send delayed by 5s due to broker enforced flow control",
     "flow_event": "send_delayed", "waited_ms": 5000, "producer": "p-1",
     "destination": "queue://orders", "capacity": 100}

``flow_event`` is one of :data:`CLIENT_FLOW_EVENTS`; any other line of a
client log (another logger, no ``flow_event``) is ignored.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import types as T

from rabbitflow_broker.events import ALL_QUEUES, EVENT_TYPES, record_fields

__all__ = [
    "ALL_QUEUES",
    "CHANNEL_BLOCKS_SCHEMA",
    "CLIENT_FLOW_EVENTS",
    "CLIENT_RECORD_SCHEMA",
    "CORRUPT_COLUMN",
    "EPISODES_SCHEMA",
    "EVENT_CODES",
    "EVENT_RECORD_SCHEMA",
    "EVENT_WIRE_SCHEMA",
    "LIFECYCLE_CODES",
    "LINES_SCHEMA",
    "OPTIONAL_FIELDS",
    "QUEUE_LIMITS_SCHEMA",
    "STORE_EPISODES_SCHEMA",
    "event_record_schema",
    "event_wire_schema",
    "key_fields",
    "required_fields",
    "spark_type",
]

#: Name of the column Spark fills with a line it could not parse.
CORRUPT_COLUMN = "_corrupt_record"

#: Broker-J's channel and connection close (``[con:7(...)/ch:1] CHN-1003 : Close``,
#: ``[con:7(...)] CON-1002 : Close``): they end a channel's block.  The
#: gateway logs them too; they are named here as well so that the pipeline
#: reads them from Broker-J logs and from gateways of any version.
LIFECYCLE_CODES: tuple[str, ...] = ("CHN-1003", "CON-1002")

#: The codes the pipeline understands (every gateway event class, and the closes).
EVENT_CODES: tuple[str, ...] = tuple(sorted(set(EVENT_TYPES) | set(LIFECYCLE_CODES)))

#: The ``flow_event`` values of the SDK's client records.
CLIENT_FLOW_EVENTS: tuple[str, ...] = (
    "send_delayed",
    "send_failed",
    "flow_enforced",
    "flow_removed",
    "connection_blocked",
    "connection_unblocked",
)

_SPARK_TYPES: dict[type, T.DataType] = {
    dt.datetime: T.TimestampType(),
    str: T.StringType(),
    int: T.LongType(),
    float: T.DoubleType(),
    bool: T.BooleanType(),
}


def spark_type(kind: type) -> T.DataType:
    """The Spark type of an event field's Python type.

    Raises:
        TypeError: the Python type has no Spark mapping.
    """
    try:
        return _SPARK_TYPES[kind]
    except KeyError:
        raise TypeError(f"no Spark type for event field type {kind!r}") from None


#: Optional record fields the pipeline reads although no event class has them
#: (yet): ``gateway`` names the member of a gateway cluster that logged the event.
OPTIONAL_FIELDS: dict[str, type] = {"gateway": str}


def event_record_schema() -> T.StructType:
    """The schema of one gateway event-log line, built from the event classes.

    Plus :data:`OPTIONAL_FIELDS` (null where a record lacks them).
    """
    fields = {**OPTIONAL_FIELDS, **record_fields()}
    ordered = {**record_fields(), **fields}
    return T.StructType(
        [T.StructField(name, spark_type(kind), nullable=True) for name, kind in ordered.items()]
    )


def required_fields() -> dict[str, tuple[str, ...]]:
    """For each event code, the record fields a well-formed line must carry."""
    import dataclasses

    result: dict[str, tuple[str, ...]] = {}
    for code, cls in EVENT_TYPES.items():
        names = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        result[code] = tuple(names)
    return result


def key_fields(code: str) -> tuple[str, ...]:
    """The fields an event of ``code`` cannot be analysed without.

    Those that place it: the queue of a QUE event, the connection and
    channel of a CHN event (and the blocking queue of CHN-1005), the vhost
    of an MST event, the connection of a CON event.  They may come from the
    record's fields or from its subject; figures (sizes, counts,
    thresholds) are optional, null when neither the record nor its message
    text carries them.
    """
    prefix = code[:4]
    if prefix == "QUE-":
        return ("vhost", "queue")
    if prefix == "CHN-":
        return (
            ("vhost", "connection", "channel", "queue")
            if code == "CHN-1005"
            else (
                "vhost",
                "connection",
                "channel",
            )
        )
    if prefix == "MST-":
        return ("vhost",)
    if prefix == "CON-":
        return ("connection",)
    raise ValueError(f"no key fields for event code {code!r}")


#: One gateway event-log record (every field of every event class).
EVENT_RECORD_SCHEMA: T.StructType = event_record_schema()


def event_wire_schema() -> T.StructType:
    """The schema to read event-log JSON with: ``ts`` as text, plus the corrupt-record column.

    ``ts`` is read as a string and cast afterwards (faster, and an
    unparseable time is then told apart from bad JSON).
    """
    return T.StructType(
        [
            T.StructField(f.name, T.StringType() if f.name == "ts" else f.dataType)
            for f in EVENT_RECORD_SCHEMA.fields
        ]
        + [T.StructField(CORRUPT_COLUMN, T.StringType())]
    )


#: How the job reads event logs with Spark's JSON source (see :func:`event_wire_schema`).
EVENT_WIRE_SCHEMA: T.StructType = event_wire_schema()

#: Raw lines as read from text files: the line and the file it came from.
LINES_SCHEMA = T.StructType(
    [
        T.StructField("value", T.StringType(), nullable=True),
        T.StructField("source", T.StringType(), nullable=False),
    ]
)

#: One client-log record (the SDK's structlog JSON record).
CLIENT_RECORD_SCHEMA = T.StructType(
    [
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("level", T.StringType()),
        T.StructField("logger", T.StringType()),
        T.StructField("event", T.StringType()),
        T.StructField("flow_event", T.StringType()),
        T.StructField("waited_ms", T.LongType()),
        T.StructField("producer", T.StringType()),
        T.StructField("destination", T.StringType()),
        T.StructField("capacity", T.LongType()),
    ]
)

#: Queue maxima (``--queue-limits``): null when a dimension is unbounded/unknown.
QUEUE_LIMITS_SCHEMA = T.StructType(
    [
        T.StructField("vhost", T.StringType(), nullable=False),
        T.StructField("queue", T.StringType(), nullable=False),
        T.StructField("max_count", T.LongType()),
        T.StructField("max_size", T.LongType()),
    ]
)

_TS = T.TimestampType()
_LONG = T.LongType()
_DOUBLE = T.DoubleType()
_STR = T.StringType()
_BOOL = T.BooleanType()


def _struct(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, kind, nullable=True) for name, kind in fields])


#: ``episodes``: one row per flow episode of a queue.
EPISODES_SCHEMA = _struct(
    ("vhost", _STR),
    ("queue", _STR),
    ("start", _TS),
    ("end", _TS),
    ("duration_s", _DOUBLE),
    ("open", _BOOL),
    ("start_messages", _LONG),
    ("start_size", _LONG),
    ("stop_count", _LONG),
    ("stop_size", _LONG),
    ("end_messages", _LONG),
    ("end_size", _LONG),
    ("resume_count", _LONG),
    ("resume_size", _LONG),
)

#: ``channel_blocks``: one row per CHN-1005 → CHN-1006/CHN-1012 block.
CHANNEL_BLOCKS_SCHEMA = _struct(
    ("connection", _LONG),
    ("channel", _LONG),
    ("queue", _STR),
    ("start", _TS),
    ("end", _TS),
    ("duration_s", _DOUBLE),
    ("open", _BOOL),
    ("closed_by", _STR),
    ("vhost", _STR),
    ("user", _STR),
    ("remote", _STR),
    ("source", _STR),
)

#: ``store_episodes``: one row per MST-1008 → MST-1009 episode of a vhost.
STORE_EPISODES_SCHEMA = _struct(
    ("vhost", _STR),
    ("start", _TS),
    ("end", _TS),
    ("duration_s", _DOUBLE),
    ("open", _BOOL),
    ("store", _STR),
    ("start_size", _LONG),
    ("overfull_size", _LONG),
    ("underfull_size", _LONG),
    ("end_size", _LONG),
)
