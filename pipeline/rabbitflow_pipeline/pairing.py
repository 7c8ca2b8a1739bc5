"""The pairing of opening and closing events into intervals.

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

**Partitioning.**  The pairing's window (:func:`pair_candidates`) is
partitioned by a 64-bit hash of the key (``key_hash``, xxhash64).  By
default the key columns follow the hash in the partition spec, so keys
never merge, at the price of comparing them in the sort.
With ``collisions`` the hash alone partitions, which is faster, and
every event is compared with its predecessor through a second,
independent 64-bit hash of the key: the observation's metric
:data:`KEY_COLLISIONS_METRIC` counts events whose predecessor has the
same partition hash but another key hash.  Zero means no two keys met
in one partition (short of a simultaneous collision of both hashes,
about 2^-128 per pair of keys); anything else means the caller must
pair again without ``collisions`` (``rabbitflow-analyze`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from rabbitflow_pipeline.inputs import is_malformed
from rabbitflow_pipeline.schemas import EVENT_CODES

__all__ = [
    "DUPLICATE_WINDOW_S",
    "KEY_COLLISIONS_METRIC",
    "KeyHash",
    "duplicate_transition",
    "finish_intervals",
    "flow_intervals",
    "pair_candidates",
    "resolve_runs",
    "seconds_between",
]

_QUEUE_OPEN = "QUE-1003"
_QUEUE_CLOSE = "QUE-1004"
_CHANNEL_OPEN = "CHN-1005"
_CHANNEL_CLOSE = ("CHN-1006", "CHN-1012", "CHN-1003")
_CONNECTION_CLOSE = "CON-1002"
_STORE_OPEN = "MST-1008"
_STORE_CLOSE = "MST-1009"


def seconds_between(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)


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
    for how, and for ``collisions`` and ``key_hash``), with the window
    pass's candidates kept (a local checkpoint, computed here) as the job
    keeps them.  :func:`finish_intervals` reads the candidates eight times
    (the runs and the connection closes): unkept, each reading would carry
    the whole parse and window plan, a plan ten times the size to analyse,
    optimise and compile, seconds even for a few rows.
    """
    candidates = pair_candidates(parsed, collisions=collisions, key_hash=key_hash)
    return finish_intervals(candidates.localCheckpoint(eager=True))


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

    The window's partitioning, ``key_hash`` and ``collisions``: see the module
    docstring.

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
    keyed, opening = _keyed(parsed, key_hash)
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
    typed = _narrowed(keyed, opening, checks, context)
    window = Window.partitionBy(*partition).orderBy("ts", "seq")
    # Same partitioning and order as the pairing's window: Spark sorts once.
    duplicate = duplicate_transition(window, duplicate_window_s)
    typed = (
        typed.select("*", duplicate.alias("_duplicate"))
        .where(~F.col("_duplicate") & ~F.col("_context"))
        .drop("_duplicate", "_context", "_gw")
    )
    return _candidates(_with_neighbours(typed, window, collisions), partition)


def _keyed(parsed: DataFrame, key_hash: KeyHash) -> tuple[DataFrame, Column]:
    """``parsed`` (ignored lines left out) with ``_code``, ``_kind``, ``_reason`` and
    ``_k_hash``; and the test of an opening event, on the code itself."""
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
    keyed = parsed.select(
        "*",
        number.alias("_code"),
        kind.alias("_kind"),
        reason.alias("_reason"),
    ).select("*", key_hash(*_key_parts(F.col)).alias("_k_hash"))
    return keyed, _is_opening(number)


def _narrowed(
    keyed: DataFrame, opening: Column, checks: Sequence[Column], context: str | None
) -> DataFrame:
    """Rows narrowed before the shuffle.

    What only an interval's start uses travels in one struct, null on
    closing events, and what only its end uses in another, null on opening
    events.  A null struct is one slot of the row, where separate columns
    would each take one.
    """
    malformed = F.col("_kind") == F.lit(_MALFORMED)
    closes_connection = F.col("_code") == F.lit(EVENT_CODES.index(_CONNECTION_CLOSE))
    gateway = F.col("gateway") if "gateway" in keyed.columns else F.lit(None).cast("string")
    return keyed.select(
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


def _with_neighbours(
    typed: DataFrame, window: WindowSpec, collisions: Observation | None
) -> DataFrame:
    """Each event with what it needs of its neighbours (and the key clash count observed)."""
    neighbours = [
        _is_opening(F.lag("_code").over(window)).alias("_prev_open"),
        _is_opening(F.lead("_code").over(window)).alias("_next_open"),
        F.lead("ts").over(window).alias("_n_ts"),
        F.lead("_code").over(window).alias("_n_code"),
        F.lead("_e").over(window).alias("_n_e"),
    ]
    if collisions is None:
        return typed.select("*", *neighbours)
    previous = F.lag("_k_check").over(window)
    neighbours.append((previous.isNotNull() & (previous != F.col("_k_check"))).alias("_clash"))
    # Observed metrics cannot hold window functions: flag first, then count.
    return typed.select("*", *neighbours).observe(
        collisions,
        F.count(F.when(F.col("_clash"), F.lit(1))).alias(KEY_COLLISIONS_METRIC),
    )


def _candidates(marked: DataFrame, partition: Sequence[str]) -> DataFrame:
    """The candidate rows of :func:`pair_candidates` from the events with their neighbours."""
    malformed = F.col("_kind") == F.lit(_MALFORMED)
    is_open = _is_opening(F.col("_code"))
    starts = is_open & ~F.col("_prev_open")
    run_start = starts & F.col("_next_open")
    run_end = is_open & F.col("_prev_open") & ~F.col("_next_open")
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
        seconds_between(F.col("start"), F.col("end")).alias("duration_s"),
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
