"""DataFrame → DataFrame transforms of the flow-control analysis.

No I/O here: the job entry (:mod:`rabbitflow_pipeline.cli`) reads lines and
writes tables; everything in between is a function of DataFrames with
explicit schemas, so it is unit-tested on hand-written logs.

Pairing rules (documented in docs/pipeline.md):

* a queue episode runs from a QUE-1003 to the *next* QUE-1004 of the same
  (vhost, queue), in timestamp order; a QUE-1003 that follows another
  QUE-1003 with no QUE-1004 between (a gateway restart re-announcing the
  state) does not open a second episode, and a QUE-1004 with no open
  episode is ignored;
* a channel block runs from CHN-1005 to the next CHN-1006, CHN-1012 or
  CHN-1003 (channel closed) of the same (source, connection, channel), or
  to the first CON-1002 (connection closed) of its (source, connection)
  after it, whichever comes first;
* a store episode runs from MST-1008 to the next MST-1009 of the same vhost;
* an episode with no closing event is ``open``: ``end`` and ``duration_s``
  are null.

Ties in timestamp are broken by ``seq`` (position in the input; the reader
assigns it), so two events of one file logged in the same millisecond keep
their file order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import WindowSpec

from rabbitflow_pipeline.schemas import (
    ALL_QUEUES,
    CHANNEL_BLOCKS_SCHEMA,
    CLIENT_FLOW_EVENTS,
    CLIENT_RECORD_SCHEMA,
    CORRUPT_COLUMN,
    EPISODES_SCHEMA,
    EVENT_CODES,
    EVENT_RECORD_SCHEMA,
    EVENT_WIRE_SCHEMA,
    STORE_EPISODES_SCHEMA,
    key_fields,
)

__all__ = [
    "DEFAULT_HISTOGRAM_EDGES_S",
    "DUPLICATE_WINDOW_S",
    "IGNORED",
    "KEY_COLLISIONS_METRIC",
    "KeyHash",
    "advice",
    "advice_from",
    "blocked_channels",
    "channel_blocks",
    "channel_blocks_from",
    "classify_events",
    "client_flow_records",
    "delay_seconds",
    "duplicate_transition",
    "duration_histogram",
    "episode_timeline",
    "episodes_from",
    "finish_intervals",
    "flow_intervals",
    "histogram_metrics",
    "histogram_rows",
    "is_malformed",
    "malformed_from",
    "malformed_summary",
    "merge_send_delays",
    "observed_window",
    "pair_candidates",
    "parse_client_lines",
    "parse_event_lines",
    "producer_capacities",
    "queue_episode_stats",
    "queue_episodes",
    "queue_summary",
    "queue_summary_from",
    "queue_summary_of_channels",
    "resolve_runs",
    "send_delays",
    "store_episodes",
    "store_episodes_from",
    "valid_events",
]

#: Bucket edges (seconds) of the delay histogram; the last bucket is open.
DEFAULT_HISTOGRAM_EDGES_S: tuple[float, ...] = (0, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)

#: Columns of a parsed event kept for the analysis (subject/message are
#: derived text and would only cost memory in the cache).
_ANALYSIS_COLUMNS: tuple[str, ...] = tuple(
    name for name in EVENT_RECORD_SCHEMA.fieldNames() if name not in ("subject", "message")
)

#: Client flow events that carry how long the send waited (``waited_ms``).
_WAIT_EVENTS = ("send_delayed", "send_failed")

_QUEUE_OPEN = "QUE-1003"
_QUEUE_CLOSE = "QUE-1004"
_CHANNEL_OPEN = "CHN-1005"
_CHANNEL_CLOSE = ("CHN-1006", "CHN-1012", "CHN-1003")
_CONNECTION_CLOSE = "CON-1002"
_STORE_OPEN = "MST-1008"
_STORE_CLOSE = "MST-1009"


def _seconds_between(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)


def _with_corrupt_column(schema: T.StructType) -> T.StructType:
    # StructType.add mutates in place: build a copy so the shared schemas stay intact.
    return T.StructType([*schema.fields, T.StructField(CORRUPT_COLUMN, T.StringType())])


def parse_event_lines(lines: DataFrame) -> DataFrame:
    """Parse gateway event-log lines (``value``, ``source``) into typed events.

    The in-memory twin of reading the files with the JSON source and
    :data:`EVENT_WIRE_SCHEMA` (what the job does, being about twice as fast);
    both end in :func:`classify_events`.  Blank lines are skipped.
    """
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    raw = (
        lines.where(F.length(F.trim(F.col("value"))) > 0)
        .select(F.from_json("value", EVENT_WIRE_SCHEMA, options).alias("r"), "source")
        .select("r.*", "source")
    )
    return classify_events(raw)


#: A Broker-J operational log line: a leading timestamp (ISO-8601 or log4j's
#: ``yyyy-MM-dd HH:mm:ss,SSS``), then somewhere the bracketed subject right
#: before ``CODE : text`` (Broker-J may print an actor subject first).
_LINE_TS = (
    r"^\s*(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}(?::?\d{2})?)?)"
    r"(?:\s|$)"
)
_LINE_EVENT = r"\[([^\[\]]+)\]\s+([A-Z]{3}-\d{4})\s*:\s*(.*?)\s*$"

# Fields recovered from a subject when the record lacks them.  Subjects are
# ``[vh(/)/qu(orders)]``, ``[vh(/)/ms(RabbitMQ)]``,
# ``[con:7(guest@127.0.0.1:50514/)/ch:1]`` and Broker-J's
# ``[con:7(guest@/127.0.0.1:50514/test)/ch:1]`` (brackets optional).
_SUBJECT_VHOST = r"vh\(([^)]*)\)"
_SUBJECT_QUEUE = r"/qu\((.*)\)\]?$"
_SUBJECT_STORE = r"/ms\((.*)\)\]?$"
_SUBJECT_CONNECTION = r"con:(\d+)\((?:([^@()]*)@)?/?(.*?):(\d+)(/[^)]*)?\)"
_SUBJECT_CHANNEL = r"/ch:(\d+)\]?$"

# Figures recovered from a message when the record lacks them (QUE-1003,
# QUE-1004 and CHN-1005 texts; Broker-J's QUE texts stop after Capacity).
_MESSAGE_FIGURES = {
    "size": r"Size : ([\d,]+) bytes",
    "capacity": r"(?<!Message |Resume )Capacity : ([\d,]+)",
    "resume_capacity": r"Resume Capacity : ([\d,]+)",
    "messages": r"Messages : ([\d,]+)",
    "message_capacity": r"Message Capacity : ([\d,]+)",
}
_MESSAGE_QUEUE = r"\(Queue (.*)\)$"
# Figures only one of the two QUE events has (the others both have).
_FIGURE_CODES = {"capacity": "QUE-1003", "resume_capacity": "QUE-1004"}

#: ``malformed_reason`` of a Broker-J operational line whose code the
#: analysis does not use (CON-1001, CHN-1001, ...): read, not malformed.
IGNORED = "ignored"


def _extract(text: Column, pattern: str, group: int = 1) -> Column:
    """Group ``group`` of ``pattern`` in ``text``; null when it does not match (or is empty)."""
    found = F.regexp_extract(text, pattern, group)
    return F.when(found != F.lit(""), found)


def _vhost_name(path: Column) -> Column:
    """Broker-J's vhost spelling to the vhost: ``/`` is ``/``, ``/test`` is ``test``.

    One expression (not a CASE on ``path == '/'``, which repeats ``path``'s code).
    """
    return F.regexp_replace(path, r"(?s)^/(?=.)", "")


def _count(text: Column) -> Column:
    return F.regexp_replace(text, ",", "").try_cast(T.LongType())


def _filled(found: Mapping[str, tuple[Column, Column]]) -> dict[str, Column]:
    """Each column of ``found`` as it is, or where it is null and ``applies``, ``value``.

    ``found`` maps a column name to ``(value, applies)``.  One test per row
    (some column is null and its value applies) is all a row that needs
    nothing pays.  The values are built as one struct, only where that
    test holds (elsewhere the struct holds the
    columns themselves), and each column reads its field of the struct
    first.  That position is evaluated for every row, so Spark's
    subexpression elimination evaluates the struct once per row in a
    generated method of its own, instead of writing every value's code
    into the stage's main loop: the loop then stays under the 8,000 bytes
    of bytecode past which HotSpot never compiles a method and leaves it to
    the interpreter.  (Without the non-null ``otherwise`` the optimizer
    pushes each field access into the CASE and the values are inlined
    again.)
    """
    needed = F.lit(False)
    for name, (_, applies) in found.items():
        needed = needed | (F.col(name).isNull() & applies)
    struct = F.when(
        needed,
        F.struct(
            *(
                F.when(F.col(name).isNull() & applies, value).alias(name)
                for name, (value, applies) in found.items()
            )
        ),
    ).otherwise(F.struct(*(F.col(name).alias(name) for name in found)))
    return {name: F.coalesce(struct.getField(name), F.col(name)) for name in found}


def _completed(raw: DataFrame) -> DataFrame:
    """Every record as a full one: Broker-J text lines read, missing fields from the text.

    A line that is not a JSON object (the corrupt-record column holds it and
    it does not start with ``{``) is read as a Broker-J operational line into
    ``ts``/``code``/``subject``/``message``; then any subject field or figure
    a record lacks is taken from its subject or message, where the event's
    code has that field.  A row pays no regular expression unless it is a
    text line or lacks a field its code has: a full gateway record passes
    three tests (a text line; a subject field missing; a figure missing)
    and is read as it is (see :func:`_filled`).
    Adds ``_text`` (the line, for a text line) and ``_ts_text``.
    """
    corrupt = F.col(CORRUPT_COLUMN)
    text = F.when(corrupt.isNotNull() & ~F.ltrim(corrupt).startswith("{"), corrupt)
    lined = raw.select("*", text.alias("_text"))
    line = F.col("_text")
    event = _LINE_TS + ".*?" + _LINE_EVENT
    read = lined.withColumns(
        {
            "_ts_text": F.coalesce(F.col("ts"), _extract(line, _LINE_TS)),
            "code": F.coalesce(F.col("code"), _extract(line, event, 3)),
            "subject": F.coalesce(F.col("subject"), _extract(line, event, 2)),
            "message": F.coalesce(F.col("message"), F.regexp_extract(line, event, 4)),
        }
    )
    subject = F.col("subject")
    message = F.col("message")
    code = F.col("code")
    queue_event = code.startswith("QUE-")
    connection_event = code.startswith("CHN-") | code.startswith("CON-")
    # (value, the codes whose events have the field): a field is recovered
    # only where it belongs, so a full record's null fields of other
    # events (CHN-1006 has no queue, QUE-1004 no stop size) cost no regex.
    recovered: dict[str, tuple[Column, Column]] = {
        "vhost": (
            _vhost_name(
                F.coalesce(
                    _extract(subject, _SUBJECT_VHOST), _extract(subject, _SUBJECT_CONNECTION, 5)
                )
            ),
            F.lit(True),
        ),
        "queue": (
            F.when(queue_event, _extract(subject, _SUBJECT_QUEUE)).otherwise(
                _extract(message, _MESSAGE_QUEUE)
            ),
            queue_event | (code == F.lit("CHN-1005")),
        ),
        "store": (_extract(subject, _SUBJECT_STORE), code.startswith("MST-")),
        "connection": (
            _extract(subject, _SUBJECT_CONNECTION, 1).try_cast(T.LongType()),
            connection_event,
        ),
        "user": (_extract(subject, _SUBJECT_CONNECTION, 2), connection_event),
        "remote_host": (_extract(subject, _SUBJECT_CONNECTION, 3), connection_event),
        "remote_port": (
            _extract(subject, _SUBJECT_CONNECTION, 4).try_cast(T.LongType()),
            connection_event,
        ),
        "channel": (
            _extract(subject, _SUBJECT_CHANNEL).try_cast(T.LongType()),
            code.startswith("CHN-"),
        ),
    }
    figures: dict[str, tuple[Column, Column]] = {
        name: (
            _count(_extract(message, pattern)),
            code == F.lit(_FIGURE_CODES[name]) if name in _FIGURE_CODES else queue_event,
        )
        for name, pattern in _MESSAGE_FIGURES.items()
    }
    # Two groups, each with one test per row (some field of the group that
    # this event has is null) and one generated method: the subject's fields
    # and the message's figures (in one method they pass the JIT's limit).
    return read.withColumns({**_filled(recovered), **_filled(figures)})


def classify_events(raw: DataFrame) -> DataFrame:
    """Type and check raw event records (:data:`EVENT_WIRE_SCHEMA` columns + ``source``).

    Inputs are told apart by content: a JSON object is a gateway record,
    any other line (Spark's JSON source leaves it in the corrupt-record
    column) is read as a Broker-J operational log line.  A record needs
    ``ts``, ``code`` and the fields that place it (:func:`key_fields`),
    which it may carry as fields or in its ``subject``; figures it lacks are
    read from its ``message`` (null when absent there too).

    Every record yields one row with the analysis columns of
    :data:`EVENT_RECORD_SCHEMA`, ``source``, ``seq`` (input position, for
    tie-breaking) and ``malformed_reason``: null for a good event,
    :data:`IGNORED` for a Broker-J line of a code the analysis does not use
    (not malformed), else one of ``bad_json`` (a ``{`` line that is not a
    JSON object), ``bad_field`` (a field of the wrong JSON type),
    ``no_timestamp`` (a text line that does not start with a timestamp),
    ``no_event_code`` (a timestamped line without ``[subject] CODE : text``),
    ``bad_ts`` (the time is not a valid ISO-8601 time), ``missing_ts``,
    ``missing_code``, ``unknown_code`` (a JSON record of a code the analysis
    does not know), ``missing_field`` (a field that places the event, in
    neither the record nor its subject).
    """
    completed = _completed(raw)
    # ts travels as text and is cast here: Spark's cast is several times
    # faster than the JSON reader's pattern-based timestamp parser.
    iso = F.regexp_replace(F.regexp_replace(F.col("_ts_text"), r"^(\S+) (\S+)$", "$1T$2"), ",", ".")
    iso = F.regexp_replace(iso, r"([+-]\d{2})(\d{2})$", "$1:$2")
    typed = completed.select(
        "*",
        F.monotonically_increasing_id().alias("seq"),
        F.when(F.col("_text").isNull(), F.col("ts").try_cast(T.TimestampType()))
        .otherwise(iso.try_cast(T.TimestampType()))
        .alias("_ts"),
    )
    missing_required = F.lit(False)
    for code in EVENT_CODES:
        lacks = F.lit(False)
        for name in key_fields(code):
            lacks = lacks | F.col(name).isNull()
        missing_required = missing_required | ((F.col("code") == code) & lacks)
    text = F.col("_text").isNotNull()
    not_json = F.col(CORRUPT_COLUMN).isNotNull() & ~text
    reason = (
        F.when(text & F.col("_ts_text").isNull(), "no_timestamp")
        .when(text & F.col("code").isNull(), "no_event_code")
        .when(not_json & F.col("ts").isNull() & F.col("code").isNull(), "bad_json")
        .when(not_json, "bad_field")
        .when(F.col("_ts_text").isNull(), "missing_ts")
        .when(F.col("_ts").isNull(), "bad_ts")
        .when(F.col("code").isNull(), "missing_code")
        .when(text & ~F.col("code").isin(*EVENT_CODES), IGNORED)
        .when(~F.col("code").isin(*EVENT_CODES), "unknown_code")
        .when(missing_required, "missing_field")
    )
    return typed.select(
        *(F.col("_ts").alias("ts") if c == "ts" else F.col(c) for c in _ANALYSIS_COLUMNS),
        "source",
        "seq",
        reason.alias("malformed_reason"),
    )


def is_malformed(reason: Column) -> Column:
    """True for a malformed line's ``malformed_reason`` (not for a good or ignored line)."""
    return reason.isNotNull() & (reason != F.lit(IGNORED))


def valid_events(parsed: DataFrame) -> DataFrame:
    """The well-formed events of :func:`parse_event_lines` (reason column dropped)."""
    return parsed.where(F.col("malformed_reason").isNull()).drop("malformed_reason")


def parse_client_lines(lines: DataFrame) -> DataFrame:
    """Parse client-log lines (``value``, ``source``) into client flow records.

    Returns the columns of :data:`CLIENT_RECORD_SCHEMA`, ``source`` and
    ``malformed_reason``: null for a flow record, ``ignored`` for a good
    JSON line that is not a flow record (another logger or event), else
    ``bad_json``, ``bad_field``, ``unknown_flow_event``, ``missing_timestamp``
    or ``missing_waited_ms`` (a delay/timeout record without its wait).
    """
    # The timestamp travels as text and is cast here, as the gateway's ts is
    # (classify_events): the JSON reader's timestamp parser is the slow part.
    schema = _with_corrupt_column(
        T.StructType(
            [
                T.StructField(f.name, T.StringType()) if f.name == "timestamp" else f
                for f in CLIENT_RECORD_SCHEMA.fields
            ]
        )
    )
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    text = (
        lines.where(F.length(F.trim(F.col("value"))) > 0)
        .select(F.from_json("value", schema, options).alias("r"), "source")
        .select("r.*", "source")
    )
    parsed = text.withColumns(
        {
            "_ts_text": F.col("timestamp"),
            "timestamp": F.col("timestamp").try_cast(T.TimestampType()),
        }
    )
    all_null = F.lit(True)
    for name in CLIENT_RECORD_SCHEMA.fieldNames():
        all_null = all_null & F.col("_ts_text" if name == "timestamp" else name).isNull()
    waits = _is_wait()
    reason = (
        F.when(F.col(CORRUPT_COLUMN).isNotNull() & all_null, "bad_json")
        .when(F.col(CORRUPT_COLUMN).isNotNull(), "bad_field")
        .when(F.col("_ts_text").isNotNull() & F.col("timestamp").isNull(), "bad_field")
        .when(F.col("flow_event").isNull(), "ignored")
        .when(~F.col("flow_event").isin(*CLIENT_FLOW_EVENTS), "unknown_flow_event")
        .when(F.col("timestamp").isNull(), "missing_timestamp")
        .when(waits & F.col("waited_ms").isNull(), "missing_waited_ms")
    )
    return parsed.select(
        *CLIENT_RECORD_SCHEMA.fieldNames(), "source", reason.alias("malformed_reason")
    )


def _is_wait() -> Column:
    """A client record of a send that waited (delay notice or timeout)."""
    return F.col("flow_event").isin(*_WAIT_EVENTS)


def delay_seconds() -> Column:
    """Seconds a send waited, on a good delay/timeout row of :func:`parse_client_lines`.

    Null on any other row (malformed, ignored, not a wait): the value the
    report's delay histogram counts (:func:`histogram_metrics`).
    """
    return F.when(
        F.col("malformed_reason").isNull() & _is_wait(), F.col("waited_ms") / F.lit(1000.0)
    )


def client_flow_records(parsed: DataFrame) -> DataFrame:
    """The good flow records of :func:`parse_client_lines` (reason dropped)."""
    return parsed.where(F.col("malformed_reason").isNull()).drop("malformed_reason")


def malformed_summary(
    parsed_events: DataFrame, parsed_client: DataFrame | None = None
) -> DataFrame:
    """Count malformed lines per (log, source, reason).

    ``log`` is ``gateway`` or ``client``; client lines that are merely not
    flow records (``ignored``) are not malformed and not counted.
    """
    gateway = parsed_events.where(is_malformed(F.col("malformed_reason"))).select(
        F.lit("gateway").alias("log"), "source", F.col("malformed_reason").alias("reason")
    )
    return _count_malformed(gateway, parsed_client)


def _count_malformed(gateway: DataFrame, parsed_client: DataFrame | None) -> DataFrame:
    frames = gateway
    if parsed_client is not None:
        client = parsed_client.where(
            F.col("malformed_reason").isNotNull() & (F.col("malformed_reason") != "ignored")
        ).select(F.lit("client").alias("log"), "source", F.col("malformed_reason").alias("reason"))
        frames = frames.unionByName(client)
    return frames.groupBy("log", "source", "reason").agg(F.count(F.lit(1)).alias("count"))


_OPEN_CODES = (_QUEUE_OPEN, _CHANNEL_OPEN, _STORE_OPEN)

# Internal kind numbers: a tinyint travels through the shuffle, the name is
# put on at the end.  A ``connection`` row is a CON-1002: not an interval,
# it ends the open blocks of its connection's channels (finish_intervals).
_MALFORMED, _QUEUE, _CHANNEL, _STORE, _CONNECTION = 0, 1, 2, 3, 4
_KIND_NAMES = {
    _MALFORMED: "malformed",
    _QUEUE: "queue",
    _CHANNEL: "channel",
    _STORE: "store",
    _CONNECTION: "connection",
}
_KIND_PREFIXES = {"QUE-": _QUEUE, "CHN-": _CHANNEL, "MST-": _STORE, "CON-": _CONNECTION}

#: Name of the :class:`~pyspark.sql.Observation` metric :func:`flow_intervals`
#: reports when it partitions by the key hash alone.
KEY_COLLISIONS_METRIC = "key_collisions"

#: A column function hashing the key columns to a long (``F.xxhash64``).
KeyHash = Callable[..., Column]

# What an interval takes from its opening event (key, start numbers,
# thresholds) and from its closing event: each set travels through the
# shuffle in a struct that is null on the other kind of event.
_START_COLUMNS = (
    "vhost",
    "queue",
    "source",
    "connection",
    "channel",
    "size",
    "messages",
    "message_capacity",
    "user",
    "remote_host",
    "remote_port",
    "store",
    "capacity",
    "overfull_size",
    "underfull_size",
)
_CLOSE_COLUMNS = ("messages", "size", "message_capacity", "resume_capacity")
# What the next event of the key contributes as the interval's end.
_END_COLUMNS = ("end", "_end_code", "end_messages", "end_size", "resume_count", "resume_size")


def _code_number(code: Column) -> Column:
    """``code``'s index in :data:`EVENT_CODES` (a tinyint), null for any other text."""
    number: Column = F.lit(None).cast("tinyint")
    for index, name in enumerate(EVENT_CODES):
        number = F.when(code == F.lit(name), F.lit(index).cast("tinyint")).otherwise(number)
    return number


def _code_text(number: Column) -> Column:
    return F.get(F.array(*(F.lit(name) for name in EVENT_CODES)), number.cast("int"))


def _is_opening(number: Column) -> Column:
    opening = [EVENT_CODES.index(code) for code in _OPEN_CODES]
    return F.coalesce(number.isin(*opening), F.lit(False))


def _key_parts(col: Callable[[str], Column]) -> list[Column]:
    """The pairing key of an event: its kind, then the columns that kind is keyed by.

    ``col`` maps a column name to the column (or to the previous row's
    column, to compare neighbours).  Columns a kind is not keyed by are null.
    """
    kind = col("_kind")
    return [
        kind,
        F.when(kind.isin(_QUEUE, _STORE), col("vhost")),
        F.when(kind == _QUEUE, col("queue")),
        F.when(kind.isin(_MALFORMED, _CHANNEL, _CONNECTION), col("source")),
        F.when(kind.isin(_CHANNEL, _CONNECTION), col("connection")),
        F.when(kind == _CHANNEL, col("channel")),
        F.when(kind == _MALFORMED, col("_reason")),
    ]


# Candidate roles (``_run``): an interval whose end is known, the start of a
# run of opening events (end still unknown), the run's last opening event
# (it carries the run's end).
_SINGLE, _RUN_START, _RUN_END = 0, 1, 2


#: Seconds within which one queue transition logged by two members of a
#: gateway cluster counts once (see :func:`pair_candidates`).
DUPLICATE_WINDOW_S = 2.0


def duplicate_transition(window: WindowSpec, within_s: float) -> Column:
    """True for a QUE-1003/1004 that another member logged first, at most ``within_s`` earlier.

    Over ``window`` (one queue's events in time order), on rows with
    ``_code``, ``ts`` and ``_gw`` (the member: null on any other event, and
    where the record has no ``gateway``): the previous event of the same
    code has a member, another one, and is at most ``within_s`` older.
    """
    before = window.rowsBetween(Window.unboundedPreceding, -1)
    limit_us = F.lit(int(within_s * 1_000_000))
    member = F.col("_gw")
    found = F.lit(False)
    for code in (_QUEUE_OPEN, _QUEUE_CLOSE):
        number = F.lit(EVENT_CODES.index(code)).cast("tinyint")
        same_code = F.col("_code") == number
        previous = F.last(
            F.when(same_code & member.isNotNull(), F.struct(F.col("ts"), member.alias("gw"))),
            ignorenulls=True,
        ).over(before)
        found = found | (
            same_code
            & (previous["gw"] != member)
            & (F.unix_micros("ts") - F.unix_micros(previous["ts"]) <= limit_us)
        )
    return member.isNotNull() & F.coalesce(found, F.lit(False))


def flow_intervals(
    parsed: DataFrame,
    *,
    collisions: Observation | None = None,
    key_hash: KeyHash = F.xxhash64,
) -> DataFrame:
    """Pair every opening event with the next closing event of its key.

    ``parsed`` is :func:`parse_event_lines` output (malformed rows allowed:
    they come out as ``kind = 'malformed'`` rows with their ``reason``) or
    :func:`valid_events` output.  Keys: (vhost, queue) for QUE, (source,
    connection, channel) for CHN, vhost for MST.  An opening event right
    after another opening event (no close between) opens nothing; a
    closing event with nothing open is ignored.

    This is :func:`finish_intervals` of :func:`pair_candidates` (see both
    for how, and for ``collisions`` and ``key_hash``); the job runs the two
    steps itself so that it computes the one window pass once.
    """
    return finish_intervals(pair_candidates(parsed, collisions=collisions, key_hash=key_hash))


def pair_candidates(
    parsed: DataFrame,
    *,
    collisions: Observation | None = None,
    key_hash: KeyHash = F.xxhash64,
    duplicate_window_s: float = DUPLICATE_WINDOW_S,
    context: str | None = None,
) -> DataFrame:
    """The one window pass of the pairing: interval candidates of every kind.

    All kinds share one window spec, so Spark shuffles and sorts the events
    once.  Each event looks at its neighbours in (``ts``, ``seq``) order: an
    opening event whose predecessor is not an opening one starts an
    interval, which ends at its successor when that is a closing event (or
    stays open when there is none).  A run of repeated opening events is
    the one case the neighbours do not settle: its first event is kept as a
    run start and its last one (whose successor is the run's end) as a run
    end, and :func:`resolve_runs` joins the two.  Rows are narrowed
    before the shuffle: codes travel as numbers, and columns only the other
    end of an interval uses are nulled.

    The window is partitioned by a 64-bit hash of the key (``key_hash``,
    xxhash64).  By default the key columns follow the hash in the partition
    spec, so keys never merge, at the price of comparing them in the sort.
    With ``collisions`` the hash alone partitions, which is faster, and
    every event is compared with its predecessor through a second,
    independent 64-bit hash of the key: the observation's metric
    :data:`KEY_COLLISIONS_METRIC` counts events whose predecessor has the
    same partition hash but another key hash.  Zero means no two keys met
    in one partition (short of a simultaneous collision of both hashes,
    about 2^-128 per pair of keys); anything else means the caller must
    pair again without ``collisions`` (``rabbitflow-analyze`` does).

    Members of a gateway cluster log each queue transition once, but two
    members may both log one (a partition, a failover): a QUE-1003 or
    QUE-1004 whose ``gateway`` differs from that of the previous event of
    the same queue and code, at most ``duplicate_window_s`` earlier, is
    dropped before the pairing (:func:`duplicate_transition`).  Rows whose
    boolean column ``context`` is true (the incremental job's last
    transitions of each queue from earlier steps) only serve that test and
    are dropped with the duplicates.

    Returns the columns of :func:`flow_intervals` that the start provides,
    the raw end columns, and private columns (names starting with ``_``)
    for :func:`finish_intervals`.
    """
    if "malformed_reason" in parsed.columns:
        # Lines read but not analysed (IGNORED) take no part in the pairing.
        parsed = parsed.where(
            F.col("malformed_reason").isNull() | is_malformed(F.col("malformed_reason"))
        )
        reason = F.col("malformed_reason")
    else:
        reason = F.lit(None).cast("string")
    number = _code_number(F.col("code"))
    kind: Column = F.lit(None).cast("tinyint")
    for prefix, value in _KIND_PREFIXES.items():
        kind = F.when(F.col("code").startswith(prefix), F.lit(value)).otherwise(kind)
    kind = F.when(reason.isNotNull(), F.lit(_MALFORMED)).otherwise(kind).cast("tinyint")
    opening = _is_opening(number)
    keyed = parsed.select(
        "*",
        number.alias("_code"),
        kind.alias("_kind"),
        reason.alias("_reason"),
    ).select("*", key_hash(*_key_parts(F.col)).alias("_k_hash"))
    if collisions is None:
        # A 64-bit hash of the key leads the partition spec so the sort's
        # binary prefix tells almost all keys apart; the key columns follow,
        # so a hash collision cannot merge two keys.
        parts = _key_parts(F.col)
        partition = ["_k_hash", *(f"_k{i}" for i in range(len(parts)))]
        checks = [p.alias(n) for p, n in zip(parts, partition[1:], strict=True)]
    else:
        partition = ["_k_hash"]
        # Salted, so it is independent of ``key_hash`` even when that is xxhash64.
        checks = [F.xxhash64(F.lit("rabbitflow-key"), *_key_parts(F.col)).alias("_k_check")]
    malformed = F.col("_kind") == F.lit(_MALFORMED)
    closes_connection = F.col("_code") == F.lit(EVENT_CODES.index(_CONNECTION_CLOSE))
    # Rows are narrowed before the shuffle: what only an interval's start
    # uses travels in one struct, null on closing events, and what only its
    # end uses in another, null on opening events.  A null struct is one
    # slot of the row, where separate columns would each take one.
    gateway = F.col("gateway") if "gateway" in parsed.columns else F.lit(None).cast("string")
    typed = keyed.select(
        "ts",
        "seq",
        "_code",
        "_kind",
        "_reason",
        "_k_hash",
        *checks,
        F.when(F.col("_kind") == F.lit(_QUEUE), gateway).alias("_gw"),
        (F.col(context) if context is not None else F.lit(False)).alias("_context"),
        F.when(
            opening | malformed | closes_connection,
            F.struct(*(F.col(c) for c in _START_COLUMNS)),
        ).alias("_s"),
        F.when(~opening & ~malformed, F.struct(*(F.col(c) for c in _CLOSE_COLUMNS))).alias("_e"),
    )
    window = Window.partitionBy(*partition).orderBy("ts", "seq")
    # Same partitioning and order as the pairing's window: Spark sorts once.
    duplicate = duplicate_transition(window, duplicate_window_s)
    typed = (
        typed.select("*", duplicate.alias("_duplicate"))
        .where(~F.col("_duplicate") & ~F.col("_context"))
        .drop("_duplicate", "_context", "_gw")
    )

    is_open = _is_opening(F.col("_code"))
    neighbours = [
        _is_opening(F.lag("_code").over(window)).alias("_prev_open"),
        _is_opening(F.lead("_code").over(window)).alias("_next_open"),
        F.lead("ts").over(window).alias("_n_ts"),
        F.lead("_code").over(window).alias("_n_code"),
        F.lead("_e").over(window).alias("_n_e"),
    ]
    if collisions is not None:
        previous = F.lag("_k_check").over(window)
        neighbours.append((previous.isNotNull() & (previous != F.col("_k_check"))).alias("_clash"))
    marked = typed.select("*", *neighbours)
    starts = is_open & ~F.col("_prev_open")
    run_start = starts & F.col("_next_open")
    run_end = is_open & F.col("_prev_open") & ~F.col("_next_open")
    if collisions is not None:
        # Observed metrics cannot hold window functions: flag first, then count.
        marked = marked.observe(
            collisions,
            F.count(F.when(F.col("_clash"), F.lit(1))).alias(KEY_COLLISIONS_METRIC),
        )
    role = (
        F.when(malformed, F.lit(_SINGLE))
        .when(run_start, F.lit(_RUN_START))
        .when(run_end, F.lit(_RUN_END))
        .otherwise(F.lit(_SINGLE))
        .cast("tinyint")
    )
    kind_name: Column = F.lit(None).cast("string")
    for value, name in _KIND_NAMES.items():
        kind_name = F.when(F.col("_kind") == F.lit(value), F.lit(name)).otherwise(kind_name)
    start = F.col("_s")
    # The next event is the end when it closes: a closing event (or nothing).
    # A connection close is a point, not an interval: it has no end.
    connection_close = F.col("_code") == F.lit(EVENT_CODES.index(_CONNECTION_CLOSE))
    ends = ~malformed & ~connection_close & ~F.col("_next_open")
    return marked.where(malformed | starts | run_end | connection_close).select(
        kind_name.alias("kind"),
        *(start[c].alias(c) for c in ("vhost", "queue", "source", "connection", "channel", "user")),
        F.concat_ws(":", start["remote_host"], start["remote_port"].cast("string")).alias("remote"),
        start["store"].alias("store"),
        F.col("ts").alias("start"),
        start["messages"].alias("start_messages"),
        start["size"].alias("start_size"),
        start["message_capacity"].alias("stop_count"),
        start["capacity"].alias("stop_size"),
        *(start[c].alias(c) for c in ("overfull_size", "underfull_size")),
        F.col("_reason").alias("reason"),
        F.when(ends, F.col("_n_ts")).alias("end"),
        F.when(ends, F.col("_n_code")).alias("_end_code"),
        F.when(ends, F.col("_n_e")["messages"]).alias("end_messages"),
        F.when(ends, F.col("_n_e")["size"]).alias("end_size"),
        F.when(ends, F.col("_n_e")["message_capacity"]).alias("resume_count"),
        F.when(ends, F.col("_n_e")["resume_capacity"]).alias("resume_size"),
        role.alias("_run"),
        F.col("seq").alias("_seq"),
        *(F.col(name).alias(f"_p{i}") for i, name in enumerate(partition)),
    )


def resolve_runs(candidates: DataFrame) -> DataFrame:
    """The run starts of :func:`pair_candidates` output, each with its run's end.

    Each run start takes the end its run's last opening event saw: the next
    run end of its key, found by a window over the run rows alone (few: a
    run of repeated opens follows a gateway restart or a lost close).
    Returns rows of the candidates' columns.
    """
    partition = sorted(c for c in candidates.columns if c.startswith("_p"))
    window = Window.partitionBy(*partition).orderBy("start", "_seq")
    runs = candidates.where(F.col("_run") != F.lit(_SINGLE))
    return runs.select(
        *(c for c in candidates.columns if c not in _END_COLUMNS),
        *(F.lead(name).over(window).alias(name) for name in _END_COLUMNS),
    ).where(F.col("_run") == F.lit(_RUN_START))


def finish_intervals(
    candidates: DataFrame, resolved: DataFrame | None = None, *, keep_seq: bool = False
) -> DataFrame:
    """The intervals (one row per interval and per malformed line) from :func:`pair_candidates`.

    ``resolved`` is :func:`resolve_runs` of the same candidates, when the
    caller computed it already (the job keeps it, being small); otherwise
    it is computed here.  With ``keep_seq`` each row also carries
    ``start_seq``, the ``seq`` of the event that opened it (the incremental
    job keeps the opening event of an interval still open).
    """
    runs = resolve_runs(candidates) if resolved is None else resolved
    rows = _close_with_connections(
        candidates.where(F.col("_run") == F.lit(_SINGLE)).unionByName(runs)
    )
    return rows.select(
        "kind",
        "vhost",
        "queue",
        "source",
        "connection",
        "channel",
        "user",
        "remote",
        "store",
        "start",
        "end",
        _seconds_between(F.col("start"), F.col("end")).alias("duration_s"),
        F.col("end").isNull().alias("open"),
        "start_messages",
        "start_size",
        "stop_count",
        "stop_size",
        "overfull_size",
        "underfull_size",
        _code_text(F.col("_end_code")).alias("closed_by"),
        "end_messages",
        "end_size",
        "resume_count",
        "resume_size",
        "reason",
        *([F.col("_seq").alias("start_seq")] if keep_seq else []),
    )


def _close_with_connections(rows: DataFrame) -> DataFrame:
    """End each channel block at its connection's first CON-1002 after it, if that comes first.

    ``rows`` are interval candidates with their ends; the CON-1002 rows
    (kind ``connection``) are consumed here.  "After" is in (``ts``,
    ``seq``) order, as everywhere in the pairing.
    """
    kind = F.col("kind")
    closes = rows.where(kind == F.lit("connection")).select(
        F.col("source").alias("_c_source"),
        F.col("connection").alias("_c_connection"),
        F.col("start").alias("_c_ts"),
        F.col("_seq").alias("_c_seq"),
    )
    blocks = rows.where(kind == F.lit("channel"))
    after = (F.col("_c_ts") > F.col("start")) | (
        (F.col("_c_ts") == F.col("start")) & (F.col("_c_seq") > F.col("_seq"))
    )
    first_close = (
        blocks.select("_seq", "source", "connection", "start")
        .join(
            closes,
            (F.col("source") == F.col("_c_source"))
            & (F.col("connection") == F.col("_c_connection"))
            & after,
        )
        .groupBy("_seq")
        .agg(F.min("_c_ts").alias("_c_ts"))
    )
    closed = blocks.join(first_close, "_seq", "left")
    by_connection = F.col("_c_ts").isNotNull() & (
        F.col("end").isNull() | (F.col("_c_ts") < F.col("end"))
    )
    connection_code = F.lit(EVENT_CODES.index(_CONNECTION_CLOSE)).cast("tinyint")
    ended = closed.withColumns(
        {
            "end": F.when(by_connection, F.col("_c_ts")).otherwise(F.col("end")),
            "_end_code": F.when(by_connection, connection_code).otherwise(F.col("_end_code")),
        }
    ).drop("_c_ts")
    others = rows.where(~kind.isin("channel", "connection"))
    return others.unionByName(ended)


def episodes_from(intervals: DataFrame) -> DataFrame:
    """The ``episodes`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "queue").select(*EPISODES_SCHEMA.fieldNames())


def channel_blocks_from(intervals: DataFrame) -> DataFrame:
    """The ``channel_blocks`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "channel").select(*CHANNEL_BLOCKS_SCHEMA.fieldNames())


def store_episodes_from(intervals: DataFrame) -> DataFrame:
    """The ``store_episodes`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "store").select(*STORE_EPISODES_SCHEMA.fieldNames())


def queue_episodes(events: DataFrame) -> DataFrame:
    """Flow episodes per (vhost, queue): QUE-1003 to the next QUE-1004.

    Columns of :data:`rabbitflow_pipeline.schemas.EPISODES_SCHEMA`.
    """
    return episodes_from(flow_intervals(events))


def channel_blocks(events: DataFrame) -> DataFrame:
    """Channel blocks: CHN-1005 to the next CHN-1006/CHN-1012 per (source, connection, channel).

    ``queue`` is the queue named by CHN-1005 (``** All Queues **`` for a
    store or administrator block); ``closed_by`` is the closing code.
    Columns of :data:`rabbitflow_pipeline.schemas.CHANNEL_BLOCKS_SCHEMA`.
    """
    return channel_blocks_from(flow_intervals(events))


def store_episodes(events: DataFrame) -> DataFrame:
    """Store episodes per vhost: MST-1008 to the next MST-1009.

    Columns of :data:`rabbitflow_pipeline.schemas.STORE_EPISODES_SCHEMA`.
    """
    return store_episodes_from(flow_intervals(events))


def malformed_from(intervals: DataFrame, parsed_client: DataFrame | None = None) -> DataFrame:
    """The ``malformed`` table from :func:`flow_intervals` (and parsed client lines)."""
    gateway = intervals.where(F.col("kind") == "malformed").select(
        F.lit("gateway").alias("log"), "source", "reason"
    )
    return _count_malformed(gateway, parsed_client)


def observed_window(events: DataFrame) -> DataFrame:
    """One row: ``window_start``, ``window_end``, ``window_s`` of all events."""
    return events.agg(
        F.min("ts").alias("window_start"), F.max("ts").alias("window_end")
    ).withColumn("window_s", _seconds_between(F.col("window_start"), F.col("window_end")))


def queue_episode_stats(episodes: DataFrame, window: DataFrame | None = None) -> DataFrame:
    """Per (vhost, queue) with episodes: what :func:`queue_summary` and :func:`advice` aggregate.

    One pass over the episodes (the job computes it once and feeds both).
    Columns: ``vhost``, ``queue``, ``flow_stopped_count``,
    ``time_overfull_s`` (an open episode counts to the end of ``window``;
    summed in whole microseconds, so independent of partitioning; null
    without a window), ``open_episodes``, ``duration_p50_s``,
    ``duration_p95_s``, ``duration_max_s`` (exact, closed episodes), the
    latest episode's ``stop_count`` and ``stop_size``, the latest closed
    episode's ``resume_count`` and ``resume_size``, and
    ``drain_rate_msgs_s`` (median over closed episodes of
    ``(start_messages - end_messages) / duration_s``).
    """
    # Time overfull is summed in whole microseconds: exact, so the total does
    # not depend on the order Spark happens to add the episodes in.
    if window is not None:
        effective = episodes.crossJoin(F.broadcast(window)).select(
            *episodes.columns,
            (
                F.unix_micros(F.coalesce(F.col("end"), F.col("window_end")))
                - F.unix_micros(F.col("start"))
            ).alias("_overfull_us"),
        )
    else:
        effective = episodes.select("*", F.lit(None).cast("long").alias("_overfull_us"))
    drain_rate = F.when(
        (F.col("duration_s") > 0) & (F.col("start_messages") >= F.col("end_messages")),
        (F.col("start_messages") - F.col("end_messages")) / F.col("duration_s"),
    )
    closed_start = F.when(~F.col("open"), F.col("start"))
    stats = effective.groupBy("vhost", "queue").agg(
        F.count(F.lit(1)).alias("flow_stopped_count"),
        (F.sum("_overfull_us") / F.lit(1_000_000.0)).alias("time_overfull_s"),
        F.sum(F.col("open").cast("long")).alias("open_episodes"),
        # Both percentiles from one buffer of the durations.
        F.percentile("duration_s", F.array(F.lit(0.5), F.lit(0.95))).alias("_durations"),
        F.max("duration_s").alias("duration_max_s"),
        F.max_by("stop_count", "start").alias("stop_count"),
        F.max_by("stop_size", "start").alias("stop_size"),
        F.max_by("resume_count", closed_start).alias("resume_count"),
        F.max_by("resume_size", closed_start).alias("resume_size"),
        F.percentile(drain_rate, F.lit(0.5)).alias("drain_rate_msgs_s"),
    )
    return stats.select(
        "vhost",
        "queue",
        "flow_stopped_count",
        "time_overfull_s",
        "open_episodes",
        F.col("_durations")[0].alias("duration_p50_s"),
        F.col("_durations")[1].alias("duration_p95_s"),
        "duration_max_s",
        "stop_count",
        "stop_size",
        "resume_count",
        "resume_size",
        "drain_rate_msgs_s",
    )


def queue_summary(episodes: DataFrame, blocks: DataFrame, window: DataFrame) -> DataFrame:
    """Per (vhost, queue): flow stops, time overfull, episode durations, channels blocked.

    ``flow_stopped_count`` counts episodes (the gateway's flowStoppedCount
    over the log); ``time_overfull_s`` adds an open episode's time up to
    the end of the observed window; ``pct_time_overfull`` is relative to
    that window.  Duration percentiles are exact, over closed episodes.
    ``channels_blocked`` counts distinct (source, connection, channel)
    blocked on the queue; store/admin blocks (``** All Queues **``) are not
    attributed to a queue.
    """
    return queue_summary_from(queue_episode_stats(episodes, window), blocks, window)


def queue_summary_from(stats: DataFrame, blocks: DataFrame, window: DataFrame) -> DataFrame:
    """:func:`queue_summary` from :func:`queue_episode_stats` (computed with ``window``)."""
    return queue_summary_of_channels(stats, blocked_channels(blocks), window)


def blocked_channels(blocks: DataFrame) -> DataFrame:
    """Channel blocks counted per queue and channel (store/admin blocks left out).

    Columns ``vhost``, ``queue``, ``source``, ``connection``, ``channel``,
    ``blocks``.  Counts add up: the incremental job adds each step's to
    the ones it stored.
    """
    return (
        blocks.where(F.col("queue") != ALL_QUEUES)
        .groupBy("vhost", "queue", "source", "connection", "channel")
        .agg(F.count(F.lit(1)).alias("blocks"))
    )


def queue_summary_of_channels(
    stats: DataFrame, channels: DataFrame, window: DataFrame
) -> DataFrame:
    """:func:`queue_summary_from` with the blocks already counted by :func:`blocked_channels`.

    ``channels`` may list a channel more than once (its counts add up).
    """
    identified = (
        F.col("source").isNotNull() & F.col("connection").isNotNull() & F.col("channel").isNotNull()
    )
    per_channel = (
        channels.groupBy("vhost", "queue", "source", "connection", "channel")
        .agg(F.sum("blocks").alias("blocks"))
        .groupBy("vhost", "queue")
        .agg(
            F.count(F.when(identified, F.lit(1))).alias("channels_blocked"),
            F.sum("blocks").alias("channel_blocks"),
        )
    )
    per_queue = stats.select(
        "vhost",
        "queue",
        "flow_stopped_count",
        "time_overfull_s",
        "open_episodes",
        "duration_p50_s",
        "duration_p95_s",
        "duration_max_s",
    )
    joined = per_queue.join(per_channel, ["vhost", "queue"], "full_outer").crossJoin(
        F.broadcast(window)
    )
    time_overfull = F.coalesce(F.col("time_overfull_s"), F.lit(0.0))
    return joined.select(
        "vhost",
        "queue",
        F.coalesce(F.col("flow_stopped_count"), F.lit(0)).alias("flow_stopped_count"),
        time_overfull.alias("time_overfull_s"),
        F.when(F.col("window_s") > 0, time_overfull * 100.0 / F.col("window_s")).alias(
            "pct_time_overfull"
        ),
        F.coalesce(F.col("open_episodes"), F.lit(0)).alias("open_episodes"),
        "duration_p50_s",
        "duration_p95_s",
        "duration_max_s",
        F.coalesce(F.col("channels_blocked"), F.lit(0)).alias("channels_blocked"),
        F.coalesce(F.col("channel_blocks"), F.lit(0)).alias("channel_blocks"),
    )


def send_delays(client: DataFrame) -> DataFrame:
    """Per (producer, destination): longest delay, delayed notices, timeouts, capacity.

    ``longest_delay_ms`` is the largest ``waited_ms`` of a delay notice or
    timeout; ``delayed_notices`` counts "send delayed" warnings;
    ``timeouts`` counts "send failed" errors; ``capacity`` is the largest
    producer capacity the records carried (null when none did).
    """
    waits = _is_wait()
    return client.groupBy("producer", "destination").agg(
        F.max(F.when(waits, F.col("waited_ms"))).alias("longest_delay_ms"),
        F.sum((F.col("flow_event") == "send_delayed").cast("long")).alias("delayed_notices"),
        F.sum((F.col("flow_event") == "send_failed").cast("long")).alias("timeouts"),
        F.sum((F.col("flow_event") == "flow_enforced").cast("long")).alias("flow_enforced"),
        F.max("capacity").alias("capacity"),
        F.min("timestamp").alias("first_seen"),
        F.max("timestamp").alias("last_seen"),
    )


def merge_send_delays(delays: DataFrame) -> DataFrame:
    """:func:`send_delays` of the whole client log from its rows for parts of it."""
    return delays.groupBy("producer", "destination").agg(
        F.max("longest_delay_ms").alias("longest_delay_ms"),
        F.sum("delayed_notices").alias("delayed_notices"),
        F.sum("timeouts").alias("timeouts"),
        F.sum("flow_enforced").alias("flow_enforced"),
        F.max("capacity").alias("capacity"),
        F.min("first_seen").alias("first_seen"),
        F.max("last_seen").alias("last_seen"),
    )


def _check_edges(edges: Sequence[float]) -> None:
    if not edges or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"histogram edges must be increasing, got {list(edges)!r}")


def _bucket(value: Column, edges: Sequence[float]) -> Column:
    """The index of the last edge ``value`` reaches; null below the first edge or for null."""
    bucket: Column = F.lit(None).cast("int")
    for index in range(len(edges)):
        bucket = F.when(value >= F.lit(float(edges[index])), F.lit(index)).otherwise(bucket)
    return bucket


def duration_histogram(
    durations: DataFrame, column: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> DataFrame:
    """Count non-null ``column`` values (seconds) per bucket ``[lower, upper)``.

    Returns ``bucket``, ``lower_s``, ``upper_s`` (null for the last, open
    bucket) and ``count``, one row per bucket including empty ones.

    Raises:
        ValueError: fewer than one edge, or edges not increasing.
    """
    _check_edges(edges)
    value = F.col(column)
    counts = (
        durations.where(value.isNotNull() & (value >= F.lit(float(edges[0]))))
        .select(_bucket(value, edges).alias("bucket"))
        .groupBy("bucket")
        .agg(F.count(F.lit(1)).alias("count"))
    )
    spark = durations.sparkSession
    buckets = spark.createDataFrame(
        [
            (i, float(lo), float(edges[i + 1]) if i + 1 < len(edges) else None)
            for i, lo in enumerate(edges)
        ],
        "bucket int, lower_s double, upper_s double",
    )
    return buckets.join(F.broadcast(counts), "bucket", "left").select(
        "bucket", "lower_s", "upper_s", F.coalesce(F.col("count"), F.lit(0)).alias("count")
    )


def histogram_metrics(
    value: Column, name: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> list[Column]:
    """Aggregate columns counting ``value`` per bucket, for :meth:`DataFrame.observe`.

    The same buckets as :func:`duration_histogram`, counted while another
    action (a table write) reads the rows; :func:`histogram_rows` turns the
    observed metrics into that function's rows.

    Raises:
        ValueError: fewer than one edge, or edges not increasing.
    """
    _check_edges(edges)
    bucket = _bucket(value, edges)
    return [
        F.count(F.when(bucket == F.lit(i), F.lit(1))).alias(f"{name}_{i}")
        for i in range(len(edges))
    ]


def histogram_rows(
    metrics: Mapping[str, Any], name: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> list[dict[str, Any]]:
    """The rows of :func:`duration_histogram` from :func:`histogram_metrics`' observed values."""
    return [
        {
            "bucket": i,
            "lower_s": float(lo),
            "upper_s": float(edges[i + 1]) if i + 1 < len(edges) else None,
            "count": int(metrics[f"{name}_{i}"]),
        }
        for i, lo in enumerate(edges)
    ]


def episode_timeline(
    episodes: DataFrame, window: DataFrame, queues: DataFrame, buckets: int = 200
) -> DataFrame:
    """Seconds overfull per time bucket for the selected queues (the report's timeline).

    ``queues`` holds the (vhost, queue) pairs to draw.  The observed window
    is cut into ``buckets`` equal slices; an open episode lasts to the end
    of the window.  Returns ``vhost``, ``queue``, ``bucket``, ``overfull_s``
    (only slices with overfull time) and ``bucket_s``.

    Raises:
        ValueError: ``buckets`` is not positive.
    """
    if buckets <= 0:
        raise ValueError(f"buckets must be positive, got {buckets}")
    w = F.broadcast(
        window.select(
            F.unix_micros("window_start").alias("_ws"),
            F.unix_micros("window_end").alias("_we"),
            F.greatest(
                F.ceil((F.unix_micros("window_end") - F.unix_micros("window_start")) / buckets),
                F.lit(1),
            ).alias("_bw"),
        )
    )
    selected = episodes.join(F.broadcast(queues.select("vhost", "queue")), ["vhost", "queue"])
    spans = selected.crossJoin(w).select(
        "vhost",
        "queue",
        "_ws",
        "_bw",
        F.unix_micros("start").alias("_s"),
        F.coalesce(F.unix_micros("end"), F.col("_we")).alias("_e"),
    )
    last = F.lit(buckets - 1)
    exploded = spans.select(
        "*",
        F.explode(
            F.sequence(
                F.least(F.floor((F.col("_s") - F.col("_ws")) / F.col("_bw")), last),
                F.least(F.floor((F.col("_e") - F.col("_ws")) / F.col("_bw")), last),
            )
        ).alias("bucket"),
    )
    lo = F.col("_ws") + F.col("bucket") * F.col("_bw")
    hi = F.when(F.col("bucket") == last, F.greatest(F.col("_e"), lo + F.col("_bw"))).otherwise(
        lo + F.col("_bw")
    )
    overlap = F.greatest(F.least(F.col("_e"), hi) - F.greatest(F.col("_s"), lo), F.lit(0))
    return (
        exploded.select(
            "vhost",
            "queue",
            F.col("bucket").cast("int").alias("bucket"),
            overlap.alias("_o"),
            "_bw",
        )
        .groupBy("vhost", "queue", "bucket")
        .agg((F.sum("_o") / 1_000_000.0).alias("overfull_s"), F.first("_bw").alias("_bw"))
        .select(
            "vhost", "queue", "bucket", "overfull_s", (F.col("_bw") / 1_000_000.0).alias("bucket_s")
        )
    )


def _fmt_int(col: Column) -> Column:
    return F.format_number(col, 0)


def advice(
    episodes: DataFrame,
    client: DataFrame | None,
    limits: DataFrame | None,
    *,
    target_block_s: float = 5.0,
) -> DataFrame:
    """Threshold advice per (vhost, queue) that had flow episodes, with the evidence as text.

    Stop: with producers of capacities c1..cn honouring flow control the
    depth can reach ``stop_count + c1 + … + cn``, which must fit under the
    queue's maximum (``limits.max_count``).  Capacities come from client
    records for ``queue://<name>`` (the largest per producer); when no client
    log covers the queue, or the maximum is unknown, the advice says so and
    uses what is known.

    Resume: producers stay blocked while the queue drains from its stop to
    its resume threshold.  The median drain rate of closed episodes gives
    the resume count that would keep a block near ``target_block_s`` (the
    SDK's default notify period: longer blocks log "send delayed").

    Raises:
        ValueError: ``target_block_s`` is not positive.
    """
    return advice_from(queue_episode_stats(episodes), client, limits, target_block_s=target_block_s)


def producer_capacities(client: DataFrame) -> DataFrame:
    """The largest capacity each producer reported per destination (client flow records).

    Columns ``destination``, ``producer``, ``capacity``; what
    :func:`send_delays` keeps as ``capacity`` too.
    """
    return (
        client.where(F.col("capacity").isNotNull() & F.col("destination").isNotNull())
        .groupBy("destination", "producer")
        .agg(F.max("capacity").alias("capacity"))
    )


def advice_from(
    stats: DataFrame,
    client: DataFrame | None,
    limits: DataFrame | None,
    *,
    target_block_s: float = 5.0,
    capacities: DataFrame | None = None,
) -> DataFrame:
    """:func:`advice` from :func:`queue_episode_stats`.

    ``capacities`` (:func:`producer_capacities`' columns) stands in for
    ``client`` when given.

    Raises:
        ValueError: ``target_block_s`` is not positive.
    """
    if not target_block_s > 0 or math.isinf(target_block_s):
        raise ValueError(f"target_block_s must be a positive number, got {target_block_s}")
    per_queue = stats.select(
        "vhost",
        "queue",
        "stop_count",
        "stop_size",
        "resume_count",
        "resume_size",
        F.col("flow_stopped_count").alias("episodes"),
        "drain_rate_msgs_s",
        F.col("duration_p50_s").alias("blocked_p50_s"),
    )
    per_queue = per_queue.withColumn("destination", F.concat(F.lit("queue://"), F.col("queue")))
    if capacities is None and client is not None:
        capacities = producer_capacities(client)
    if capacities is not None:
        capacities = capacities.groupBy("destination").agg(
            F.count(F.lit(1)).alias("producers"), F.sum("capacity").alias("capacity_sum")
        )
        per_queue = per_queue.join(capacities, "destination", "left")
    else:
        per_queue = per_queue.withColumn("producers", F.lit(None).cast("long")).withColumn(
            "capacity_sum", F.lit(None).cast("long")
        )
    if limits is not None:
        per_queue = per_queue.join(
            limits.select("vhost", "queue", "max_count", "max_size"), ["vhost", "queue"], "left"
        )
    else:
        per_queue = per_queue.withColumn("max_count", F.lit(None).cast("long")).withColumn(
            "max_size", F.lit(None).cast("long")
        )

    stop = F.col("stop_count")
    cap = F.col("capacity_sum")
    mx = F.col("max_count")
    worst = stop + cap
    has_stop = stop.isNotNull() & (stop > 0)
    stop_ok = F.when(has_stop & cap.isNotNull() & mx.isNotNull(), worst <= mx)
    suggested_stop = F.when(has_stop & cap.isNotNull() & mx.isNotNull() & (worst > mx), mx - cap)
    cap_text = F.format_string(
        "producer capacities %s (%s producers in client logs)", _fmt_int(cap), F.col("producers")
    )
    unknown_cap_text = F.concat(
        F.lit("producer capacities unknown (no client log for "), F.col("destination"), F.lit(")")
    )
    stop_advice = (
        F.when(
            ~has_stop,
            F.concat(
                F.lit("no message-count stop threshold (stop size "),
                _fmt_int(F.coalesce(F.col("stop_size"), F.lit(0))),
                F.lit(" bytes); producer capacities bound messages, not bytes"),
                F.when(
                    F.col("max_size").isNotNull(),
                    F.concat(
                        F.lit("; queue maximum "), _fmt_int(F.col("max_size")), F.lit(" bytes")
                    ),
                ).otherwise(F.lit("")),
            ),
        )
        .when(
            cap.isNotNull() & mx.isNotNull() & (worst <= mx),
            F.concat(
                F.lit("OK: stop "),
                _fmt_int(stop),
                F.lit(" + "),
                cap_text,
                F.lit(" = "),
                _fmt_int(worst),
                F.lit(" <= queue maximum "),
                _fmt_int(mx),
            ),
        )
        .when(
            cap.isNotNull() & mx.isNotNull() & (mx - cap > 0),
            F.concat(
                F.lit("LOWER STOP: stop "),
                _fmt_int(stop),
                F.lit(" + "),
                cap_text,
                F.lit(" = "),
                _fmt_int(worst),
                F.lit(" exceeds queue maximum "),
                _fmt_int(mx),
                F.lit(" by "),
                _fmt_int(worst - mx),
                F.lit("; set qpid.flow_stop_count <= "),
                _fmt_int(mx - cap),
            ),
        )
        .when(
            cap.isNotNull() & mx.isNotNull(),
            F.concat(
                F.lit("REDUCE CAPACITIES: "),
                cap_text,
                F.lit(" alone reach queue maximum "),
                _fmt_int(mx),
                F.lit("; lower producer capacities or raise the maximum"),
            ),
        )
        .when(
            cap.isNotNull(),
            F.concat(
                F.lit("queue maximum unknown (pass --queue-limits): depth can reach stop "),
                _fmt_int(stop),
                F.lit(" + "),
                cap_text,
                F.lit(" = "),
                _fmt_int(worst),
                F.lit("; the maximum must be at least that"),
            ),
        )
        .when(
            mx.isNotNull(),
            F.concat(
                unknown_cap_text,
                F.lit(": stop "),
                _fmt_int(stop),
                F.lit(" leaves "),
                _fmt_int(mx - stop),
                F.lit(" messages under queue maximum "),
                _fmt_int(mx),
                F.lit("; the producers' capacities must sum to at most that"),
            ),
        )
        .otherwise(
            F.concat(
                unknown_cap_text,
                F.lit(" and queue maximum unknown: depth can reach stop "),
                _fmt_int(stop),
                F.lit(" + the sum of producer capacities"),
            )
        )
    )

    rate = F.col("drain_rate_msgs_s")
    resume = F.col("resume_count")
    p50 = F.col("blocked_p50_s")
    needed = F.ceil(rate * F.lit(float(target_block_s)))
    candidate = F.greatest(resume, stop - needed)
    capped = F.least(candidate, stop - F.lit(1))
    count_mode = has_stop & resume.isNotNull() & (resume > 0)
    too_long = count_mode & rate.isNotNull() & (rate > 0) & (p50 > F.lit(float(target_block_s)))
    suggested_resume = F.when(too_long & (capped > resume), capped)
    target_text = F.format_string("%.0fs", F.lit(float(target_block_s)))
    evidence = F.concat(
        F.lit("producers blocked p50 "),
        F.format_string("%.1fs", p50),
        F.lit(" while the queue drained from stop "),
        _fmt_int(stop),
        F.lit(" to resume "),
        _fmt_int(resume),
        F.lit(" at "),
        F.format_string("%.1f msg/s", rate),
    )
    resume_advice = (
        F.when(~count_mode, F.lit("no message-count resume threshold: no count-based advice"))
        .when(
            rate.isNull() | p50.isNull(),
            F.lit("no closed episode with a measurable drain: drain time unknown"),
        )
        .when(
            suggested_resume.isNotNull(),
            F.concat(
                F.lit("RAISE RESUME: "),
                evidence,
                F.lit("; resume at "),
                _fmt_int(suggested_resume),
                F.lit(" to keep blocks near "),
                target_text,
                F.lit(" (at the cost of more frequent stops)"),
            ),
        )
        .otherwise(F.concat(F.lit("OK: "), evidence))
    )
    return per_queue.select(
        "vhost",
        "queue",
        "episodes",
        "stop_count",
        "resume_count",
        "stop_size",
        "resume_size",
        "max_count",
        "max_size",
        "producers",
        "capacity_sum",
        F.when(has_stop & cap.isNotNull(), worst).alias("worst_case_depth"),
        stop_ok.alias("stop_ok"),
        suggested_stop.alias("suggested_stop_count"),
        stop_advice.alias("stop_advice"),
        "drain_rate_msgs_s",
        "blocked_p50_s",
        suggested_resume.alias("suggested_resume_count"),
        resume_advice.alias("resume_advice"),
    )
