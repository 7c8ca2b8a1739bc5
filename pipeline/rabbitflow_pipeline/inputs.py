"""The parsed input tables: gateway event records and client-log flow records.

Both logs are read by content: a gateway line is a JSON record or a
Broker-J operational log line (:func:`classify_events`); a client line is
a JSON log record, of which the flow records are kept
(:func:`parse_client_lines`).  Every line yields one row with its
``malformed_reason`` (null for a good one).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rabbitflow_pipeline.schemas import (
    CLIENT_FLOW_EVENTS,
    CLIENT_RECORD_SCHEMA,
    CORRUPT_COLUMN,
    EVENT_CODES,
    EVENT_RECORD_SCHEMA,
    EVENT_WIRE_SCHEMA,
    key_fields,
)

__all__ = [
    "IGNORED",
    "classify_events",
    "client_flow_records",
    "delay_seconds",
    "is_malformed",
    "is_wait",
    "parse_client_lines",
    "parse_event_lines",
    "valid_events",
]

#: Columns of a parsed event kept for the analysis (subject/message are
#: derived text and would only cost memory in the cache).
_ANALYSIS_COLUMNS: tuple[str, ...] = tuple(
    name for name in EVENT_RECORD_SCHEMA.fieldNames() if name not in ("subject", "message")
)

#: Client flow events that carry how long the send waited (``waited_ms``).
_WAIT_EVENTS = ("send_delayed", "send_failed")


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
    # Two groups, each with one test per row (some field of the group that
    # this event has is null) and one generated method: the subject's fields
    # and the message's figures (in one method they pass the JIT's limit).
    return read.withColumns({**_filled(_subject_fields()), **_filled(_message_figures())})


def _subject_fields() -> dict[str, tuple[Column, Column]]:
    """Each subject field: (its value read from the subject, the events that have it).

    A field is recovered only where it belongs, so a full record's null
    fields of other events (CHN-1006 has no queue) cost no regex.
    """
    subject = F.col("subject")
    message = F.col("message")
    code = F.col("code")
    queue_event = code.startswith("QUE-")
    connection_event = code.startswith("CHN-") | code.startswith("CON-")
    return {
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


def _message_figures() -> dict[str, tuple[Column, Column]]:
    """Each figure: (its value read from the message, the events that have it).

    QUE-1004 has no stop size: its null one costs no regex.
    """
    message = F.col("message")
    code = F.col("code")
    queue_event = code.startswith("QUE-")
    return {
        name: (
            _count(_extract(message, pattern)),
            code == F.lit(_FIGURE_CODES[name]) if name in _FIGURE_CODES else queue_event,
        )
        for name, pattern in _MESSAGE_FIGURES.items()
    }


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
    missing_required = _missing_required()
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
    return _planned_apart(
        typed,
        *(F.col("_ts").alias("ts") if c == "ts" else F.col(c) for c in _ANALYSIS_COLUMNS),
        F.col("source"),
        F.col("seq"),
        reason.alias("malformed_reason"),
    )


def _planned_apart(df: DataFrame, *columns: Column) -> DataFrame:
    """``df.select(*columns)`` behind a one-row generator, which no filter or
    projection is pushed through.

    Without it, a query over the classified events that did not read
    ``seq`` (the one nondeterministic column, which otherwise stops the
    optimizer) had every later filter rewritten in terms of the JSON
    fields: ``malformed_reason`` inlined with all the columns it reads, each
    inlined in turn, a tree of thousands of expressions that took seconds
    to plan for two rows.
    """
    return df.select(F.inline(F.array(F.struct(*columns))))


def _missing_required() -> Column:
    """True for a record that lacks a field that places its event (:func:`key_fields`)."""
    missing_required = F.lit(False)
    for code in EVENT_CODES:
        lacks = F.lit(False)
        for name in key_fields(code):
            lacks = lacks | F.col(name).isNull()
        missing_required = missing_required | ((F.col("code") == code) & lacks)
    return missing_required


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
    waits = is_wait()
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


def is_wait() -> Column:
    """A client record of a send that waited (delay notice or timeout)."""
    return F.col("flow_event").isin(*_WAIT_EVENTS)


def delay_seconds() -> Column:
    """Seconds a send waited, on a good delay/timeout row of :func:`parse_client_lines`.

    Null on any other row (malformed, ignored, not a wait): the value the
    report's delay histogram counts (:func:`histogram_metrics`).
    """
    return F.when(
        F.col("malformed_reason").isNull() & is_wait(), F.col("waited_ms") / F.lit(1000.0)
    )


def client_flow_records(parsed: DataFrame) -> DataFrame:
    """The good flow records of :func:`parse_client_lines` (reason dropped)."""
    return parsed.where(F.col("malformed_reason").isNull()).drop("malformed_reason")
