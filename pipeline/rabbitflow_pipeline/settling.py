"""One incremental step's state and pairing: the new events parsed, paired with
the stored state, split into settled and provisional rows.

**Settling.**  Events of one key may come from several files (several
gateways log the same queue), and one file may be read further than
another.  An event is *settled* once it is at least ``lateness`` older
than the newest event seen (the *frontier*).  Each step pairs the stored
state (the opening event of every interval still open, and the events
not yet settled) with the new events, in one pass.  A row whose end is
settled is final (kept in the step's ``b`` files); every other row is
provisional (the step's ``p`` files, replaced at the next step), and its
opening event, if settled, is stored for the next step together with the
unsettled events.  So an event of another file that arrives up to
``lateness`` late still falls into its place; one later than that
(``late`` in the result) is paired where it lands.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline.checkpoint import (
    INTERVAL_TABLES,
    STATE_DIR,
    Checkpoint,
    source_column,
    staged_paths,
)
from rabbitflow_pipeline.histograms import (
    histogram_metrics,
)
from rabbitflow_pipeline.inputs import IGNORED, delay_seconds, is_malformed
from rabbitflow_pipeline.pairing import finish_intervals, pair_candidates
from rabbitflow_pipeline.plan import (
    INTERVAL_STEPS,
    PARSE_CLIENT,
    PARSE_EVENTS,
)
from rabbitflow_pipeline.readers import event_records
from rabbitflow_pipeline.schemas import (
    CHANNEL_BLOCKS_SCHEMA,
    EPISODES_SCHEMA,
    EVENT_WIRE_SCHEMA,
    LINES_SCHEMA,
    STORE_EPISODES_SCHEMA,
)

__all__ = [
    "INTERVAL_SCHEMAS",
    "SMALL_TABLES",
    "StepState",
    "arrow_frame",
    "compact",
    "empty_client",
    "fetch_small",
    "final_rows",
    "higher",
    "lower",
    "pair_step",
    "parse_step",
    "provisional_rows",
    "read_table",
    "value_frame",
    "write_parts",
]

#: Settled file sets past which a step compacts a table's into one.
_COMPACT_AFTER = 48

INTERVAL_SCHEMAS = {
    "episodes": EPISODES_SCHEMA,
    "channel_blocks": CHANNEL_BLOCKS_SCHEMA,
    "store_episodes": STORE_EPISODES_SCHEMA,
}
_KIND_OF = {"episodes": "queue", "channel_blocks": "channel", "store_episodes": "store"}


_INTERVAL_STEP_OF = {step.builds: step for step in INTERVAL_STEPS}


#: State rows: the opening event of an open interval, an unsettled event,
#: the last transition of a queue (only for the duplicate test), a new event.
_OPEN, _PENDING, _CONTEXT, _NEW = "open", "pending", "context", "new"


def lower(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def higher(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class StepState:
    """One step's inputs and what its stages hand each other."""

    spark: SparkSession
    out: Path
    cp: Checkpoint
    parts: Sequence[Mapping[str, Any]]
    lateness_us: int
    kept: outputs.Kept
    pool: ThreadPoolExecutor
    counts: dict[str, Any] | None = None
    client: DataFrame | None = None
    delay_counts: dict[str, int] | None = None
    intervals: DataFrame | None = None
    step_counts: dict[str, Any] | None = None
    tables: dict[str, tuple[str, ...]] | None = None
    state: str | None = None
    channels: str | None = None
    #: ``_state``-relative directory of the per-queue episode statistics.
    stats: str | None = None
    #: The observed window after this step (one row, read from the step's file of it).
    window: DataFrame | None = None
    #: The small aggregate tables' rows (for the report).
    small: dict[str, list[dict[str, Any]]] | None = None

    @property
    def batch(self) -> int:
        return self.cp.batch + 1

    @property
    def root(self) -> Path:
        return self.out / STATE_DIR

    def of_kind(self, kind: str) -> list[Mapping[str, Any]]:
        return [p for p in self.parts if p["kind"] == kind]

    @property
    def frontier_us(self) -> int | None:
        assert self.counts is not None
        end = higher(self.cp.window_end_us, self.counts["end_us"])
        frontier = self.cp.frontier_us
        if end is not None:
            frontier = higher(frontier, end - self.lateness_us)
        return frontier


def _parse_events(step: StepState) -> DataFrame:
    """Staged event-log lines → classified events (the batch job's reader and parser)."""
    parts = step.of_kind("events")
    spark = step.spark
    if parts:
        raw = event_records(spark, staged_paths(step.out, step.batch, parts))
        raw = raw.select("*", source_column(parts).alias("source"))
    else:
        raw = spark.createDataFrame([], EVENT_WIRE_SCHEMA).select("*", F.lit("").alias("source"))
    return PARSE_EVENTS({"event_records": raw})


def _event_metrics() -> list[Column]:
    """What a step counts while it writes its parsed events.

    No value of the step's own in them (nor in the parse): the parse's
    generated code, large and slow to compile, is then the same at every
    step, and Spark reuses it.
    """
    good_us = F.when(F.col("malformed_reason").isNull(), F.unix_micros("ts"))
    return [
        F.count(F.lit(1)).alias("lines"),
        F.count(F.when(is_malformed(F.col("malformed_reason")), 1)).alias("malformed"),
        F.count(F.when(F.col("malformed_reason") == IGNORED, 1)).alias("ignored"),
        F.min(good_us).alias("start_us"),
        F.max(good_us).alias("end_us"),
    ]


#: The step number's place in a stored event's ``seq`` (see :func:`_global_seq`).
_SEQ_STEP_SHIFT = 40
_ROW_BITS = 33
_PARTITION_SHIFT = 28


def _global_seq() -> Column:
    """An event's input position across steps, from its step and its position in the step.

    ``seq`` is ``monotonically_increasing_id()`` within the step (partition
    index above bit 33, row below): packed into 40 bits (partition index
    above bit 28, up to 2^28 rows per partition and 2^12 partitions per
    step) under the step number, taken from the event store's ``batch=N``
    directory, so no literal of the step's own enters the generated code.
    """
    seq = F.col("seq")
    row = F.expr(f"seq & {(1 << _ROW_BITS) - 1}")
    partition = F.shiftright(seq, _ROW_BITS)
    return (
        F.shiftleft(F.col("batch").cast("long"), _SEQ_STEP_SHIFT)
        + F.shiftleft(partition, _PARTITION_SHIFT)
        + row
    )


def _events_dir(step: StepState) -> Path:
    return step.out / "events" / f"batch={step.batch}"


def parse_step(step: StepState) -> None:
    """Parse the new event lines once into the event store (counting them on the way)."""
    classified = _parse_events(step)
    metrics = _event_metrics()
    observation = Observation("step-events")
    client = step.pool.submit(_parse_client, step)
    classified.observe(observation, *metrics).write.mode("overwrite").parquet(
        str(_events_dir(step))
    )
    counts = dict(observation.get)
    if "lines" not in counts:  # Spark Connect reports no metrics observed under a write
        row = _new_events(step).agg(*metrics).first()
        counts = {} if row is None else row.asDict()
    step.counts = counts
    client.result()


def _new_events(step: StepState) -> DataFrame:
    """The step's parsed events from the event store, ``seq`` made unique across steps."""
    schema = _event_schema(step.spark)
    stored = T.StructType([*schema.fields, T.StructField("batch", T.IntegerType())])
    events = (
        step.spark.read.schema(stored)
        .option("basePath", str(step.out / "events"))
        .parquet(str(_events_dir(step)))
    )
    return events.withColumn("seq", _global_seq()).drop("batch")


def _may_be_late(step: StepState) -> bool:
    """Whether a new good event may be late: the oldest one is no newer than the last frontier.

    Usually not (each file is read on in time order), and then no job counts them.
    """
    assert step.counts is not None
    oldest = step.counts.get("start_us")
    return step.cp.frontier_us is not None and oldest is not None and oldest <= step.cp.frontier_us


def _late(step: StepState, events: DataFrame) -> int:
    """New good events older than the last step's frontier (paired where they land)."""
    if step.cp.frontier_us is None:
        return 0
    previous = value_frame(step, "previous-frontier", {"_previous_us": step.cp.frontier_us})
    late = F.col("malformed_reason").isNull() & (F.unix_micros("ts") <= F.col("_previous_us"))
    return events.crossJoin(F.broadcast(previous)).where(late).count()


def _parse_client(step: StepState) -> None:
    """The new client records, kept, and the delay histogram counted over them."""
    parts = step.of_kind("client")
    if not parts:
        return
    lines = step.spark.read.text(staged_paths(step.out, step.batch, parts)).select(
        "value", source_column(parts).alias("source")
    )
    parsed = PARSE_CLIENT({"client_lines": lines})
    metrics = histogram_metrics(delay_seconds(), "delay")
    observation = Observation("step-delays")
    # Counted while the rows are kept, not in a job of their own.
    step.client = step.kept.keep(parsed.observe(observation, *metrics))
    counts = dict(observation.get)
    if not counts:  # Spark Connect reports no metrics observed under a local checkpoint
        row = step.client.agg(*metrics).first()
        counts = {} if row is None else row.asDict()
    step.delay_counts = {k: int(v) for k, v in counts.items()}


def empty_client(spark: SparkSession) -> DataFrame:
    return PARSE_CLIENT({"client_lines": spark.createDataFrame([], LINES_SCHEMA)})


def pair_step(step: StepState) -> None:
    """Pair the stored state with the new events in one pass; keep the intervals."""
    spark = step.spark
    schema = _event_schema(spark)
    fresh = _new_events(step)
    late = step.pool.submit(_late, step, fresh) if _may_be_late(step) else None
    new_events = fresh.withColumn("_role", F.lit(_NEW))
    if step.cp.state is not None:
        state_schema = T.StructType([*schema.fields, T.StructField("_role", T.StringType())])
        previous = spark.read.schema(state_schema).parquet(str(step.root / step.cp.state))
        pool = previous.unionByName(new_events)
    else:
        pool = new_events
    frontier = _frontier_frame(step)
    context = (F.col("_role") == F.lit(_CONTEXT)).alias("_is_context")
    # The window pass kept first, as the batch job does: the joins that
    # finish the intervals read it (a broadcast of the connection closes
    # would otherwise run the window pass once more, in a job of its own).
    candidates = step.kept.keep(pair_candidates(pool.select("*", context), context="_is_context"))
    intervals = finish_intervals(candidates, keep_seq=True)
    # The final test applied and the step's counts observed as the intervals are kept.
    observation, metrics = Observation("step-intervals"), _step_metrics()
    # Kept in a few partitions: the pairing's unions leave about thirty, and
    # each of the many small jobs reading the intervals would run a task per partition.
    final = _with_final(intervals, frontier).observe(observation, *metrics)
    step.intervals = step.kept.keep(final.coalesce(_INTERVAL_PARTITIONS))
    counts = dict(observation.get)
    if not counts:  # Spark Connect reports no metrics observed under a local checkpoint
        row = step.intervals.agg(*metrics).first()
        assert row is not None
        counts = row.asDict()
    step.step_counts = counts
    step.state = f"state/v{step.batch:08d}"
    opened = (
        provisional_rows(step)
        .where(F.col("kind").isin("queue", "channel", "store"))
        .select(F.col("start_seq").alias("seq"))
    )
    state = step.pool.submit(_write_state, step, pool, frontier, opened)
    written = [step.pool.submit(_write_intervals, step, table) for table in INTERVAL_TABLES]
    step.tables = dict(done.result() for done in written)
    state.result()
    assert step.counts is not None
    step.counts["late"] = 0 if late is None else late.result()


def _frontier_frame(step: StepState) -> DataFrame:
    """This step's frontier (``_frontier_us``, null before any event) as a one-row DataFrame."""
    return value_frame(step, "frontier", {"_frontier_us": step.frontier_us})


def value_frame(step: StepState, name: str, values: Mapping[str, int | None]) -> DataFrame:
    """One row of long columns, ``values``, read from a file the step writes, not literals.

    Spark folds a literal into the generated code of every stage that
    compares with it (even through a cross join with a one-row frame of
    literals: its optimizer propagates the value), so a value new at each
    step (the frontier, the observed window) would compile that code again,
    and run it cold before the JIT compiles it, at each step.  A file's
    value is not known when the query is planned, so the code stays the same.
    """
    columns = {column: pa.array([value], pa.int64()) for column, value in values.items()}
    schema = ", ".join(f"{column} long" for column in values)
    return arrow_frame(step, name, pa.table(columns), schema)


def arrow_frame(step: StepState, name: str, table: pa.Table, schema: Any) -> DataFrame:
    """``table`` (built in the driver) as a DataFrame of ``schema``, read from a file the
    step writes under its ``tmp`` area as ``name`` (see :func:`value_frame`)."""
    path = step.root / "tmp" / f"{name}-{step.batch:08d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return step.spark.read.schema(schema).parquet(str(path))


def _with_frontier(df: DataFrame, frontier: DataFrame, name: str, test: Column) -> DataFrame:
    """``df`` with the boolean column ``name``: ``test``, which may read ``_frontier_us``."""
    joined = df.crossJoin(F.broadcast(frontier))
    return joined.select(*(F.col(c) for c in df.columns), test.alias(name))


def _with_final(intervals: DataFrame, frontier: DataFrame) -> DataFrame:
    """``_final``: an interval is final once its end is settled (a malformed line: at once)."""
    settled_end = F.unix_micros("end") <= F.col("_frontier_us")
    final = (F.col("kind") == F.lit("malformed")) | F.coalesce(settled_end, F.lit(False))
    return _with_frontier(intervals, frontier, "_final", final)


def final_rows(step: StepState) -> DataFrame:
    assert step.intervals is not None
    return step.intervals.where(F.col("_final"))


def provisional_rows(step: StepState) -> DataFrame:
    assert step.intervals is not None
    return step.intervals.where(~F.col("_final"))


#: The parsed event's schema, built once per process (planning the parse
#: to learn it costs most of a second of the driver's time).
_EVENT_SCHEMA: list[T.StructType] = []


def _event_schema(spark: SparkSession) -> T.StructType:
    """The schema of a parsed event (:func:`~rabbitflow_pipeline.inputs.classify_events`)."""
    if not _EVENT_SCHEMA:
        empty = spark.createDataFrame([], EVENT_WIRE_SCHEMA).select("*", F.lit("").alias("source"))
        _EVENT_SCHEMA.append(PARSE_EVENTS({"event_records": empty}).schema)
    return _EVENT_SCHEMA[0]


def _write_state(step: StepState, pool: DataFrame, frontier: DataFrame, opened: DataFrame) -> None:
    """The next step's state: open starts, unsettled events, each queue's last transitions."""
    role = F.col("_role")
    # Settled: malformed (counted at once), or no newer than the frontier
    # (everything, before any event).
    settled_ts = F.coalesce(
        F.unix_micros("ts") <= F.col("_frontier_us"), F.col("_frontier_us").isNull()
    )
    test = F.col("malformed_reason").isNotNull() | settled_ts
    pool = _with_frontier(pool, frontier, "_settled", test)
    settled = F.col("_settled")
    settled_pool = pool.where(settled)
    starts = settled_pool.where(role != F.lit(_CONTEXT)).join(opened, "seq", "left_semi")
    pending = pool.where(~settled)
    # The last QUE-1003 and QUE-1004 of each queue logged by a cluster member:
    # what a later duplicate of that transition is told apart by.
    transitions = settled_pool.where(
        F.col("malformed_reason").isNull()
        & F.col("code").isin("QUE-1003", "QUE-1004")
        & F.col("gateway").isNotNull()
    )
    columns = [c for c in pool.columns if c not in ("_role", "_settled")]
    last = (
        transitions.groupBy("vhost", "queue", "code")
        .agg(F.max_by(F.struct(*columns), F.struct("ts", "seq")).alias("_e"))
        .select("_e.*")
        .join(opened, "seq", "left_anti")
    )
    state = (
        starts.select(*columns, F.lit(_OPEN).alias("_role"))
        .unionByName(pending.select(*columns, F.lit(_PENDING).alias("_role")))
        .unionByName(last.select(*columns).withColumn("_role", F.lit(_CONTEXT)))
    )
    assert step.state is not None
    # One file: the next step reads it in one task, not one per shuffle
    # partition.  Gathered by a shuffle, not coalesced: coalescing would scan
    # the whole pool in that one task (all of the input, at a first step).
    state.repartition(1).write.mode("overwrite").parquet(str(step.root / step.state))


def _step_metrics() -> list[Column]:
    """Rows per table and block-duration histograms, settled and provisional."""
    final = F.col("_final")
    block = F.col("kind") == F.lit("channel")
    metrics = []
    for name, rows in (("final", final), ("prov", ~final)):
        for table, kind in _KIND_OF.items():
            metrics.append(
                F.count(F.when(rows & (F.col("kind") == F.lit(kind)), 1)).alias(f"{name}_{table}")
            )
        duration = F.when(rows & block, F.col("duration_s"))
        metrics.extend(histogram_metrics(duration, f"{name}_block"))
    open_episode = ~final & F.col("open") & (F.col("kind") == F.lit("queue"))
    metrics.append(F.count(F.when(open_episode, 1)).alias("open_episodes"))
    return metrics


def _write_intervals(step: StepState, table: str) -> tuple[str, tuple[str, ...]]:
    """This step's settled and provisional rows of ``table``; returns its current files."""
    select = _INTERVAL_STEP_OF[table]
    assert step.step_counts is not None
    kept = [f for f in step.cp.tables.get(table, ()) if f.startswith("b")]
    # A file set with no rows is not written, unless the table would have
    # no file at all (its readers need one for the schema).
    final, provisional = step.step_counts[f"final_{table}"], step.step_counts[f"prov_{table}"]
    sets = []
    if final:
        sets.append((f"b{step.batch:08d}", select({"intervals": final_rows(step)}), final))
    if provisional or not (kept or final):
        sets.append(
            (f"p{step.batch:08d}", select({"intervals": provisional_rows(step)}), provisional)
        )
    return table, (*kept, *_add_file_sets(step, table, sets))


def _add_file_sets(
    step: StepState, table: str, sets: Sequence[tuple[str, DataFrame, int]]
) -> list[str]:
    """Write each ``(prefix, rows, count)`` of ``sets`` as :func:`add_files` does, in one job.

    The sets are told apart by a partition column of the write (each
    partition's part files are moved under its prefix): one Spark job for
    a table's settled and open rows, not one each.  Not for a million rows
    or more (a first step over a long history): a partitioned write sorts
    its rows by the partition first, and there the jobs are not what costs.
    """
    rows = sum(count for _, _, count in sets)
    if len(sets) <= 1 or rows >= _ROWS_PER_FILE:
        return [name for prefix, df, n in sets for name in add_files(step, df, table, prefix, n)]
    union = None
    for prefix, df, _ in sets:
        tagged = df.withColumn(_SET_COLUMN, F.lit(prefix))
        union = tagged if union is None else union.unionByName(tagged)
    assert union is not None
    tmp = step.root / "tmp" / f"{table}-b{step.batch:08d}-sets"
    shutil.rmtree(tmp, ignore_errors=True)
    outputs.write_table(union.coalesce(1), tmp, partition_by=_SET_COLUMN)
    names: list[str] = []
    for prefix, _, _ in sets:
        names += _move_parts(tmp / f"{_SET_COLUMN}={prefix}", step.out / table, prefix)
    shutil.rmtree(tmp, ignore_errors=True)
    return names


#: The partition column that tells a table's file sets apart in one write.
_SET_COLUMN = "_file_set"


#: Partitions the step's intervals are kept in.
_INTERVAL_PARTITIONS = 4

#: Rows per file a step writes to a table (a first step over a long history
#: writes several, in parallel tasks).
_ROWS_PER_FILE = 1_000_000


def add_files(step: StepState, df: DataFrame, table: str, prefix: str, rows: int = 0) -> list[str]:
    """Write ``df`` (about ``rows`` rows) and move its part files into ``out/table`` as
    ``prefix-NNNN.parquet``."""
    # One file per step and table (a step adds a few percent of the rows),
    # one per million rows when it adds more.
    df = df.coalesce(1 + int(rows) // _ROWS_PER_FILE)
    return write_parts(df, step.root / "tmp" / f"{table}-{prefix}", step.out / table, prefix)


def write_parts(df: DataFrame, tmp: Path, directory: Path, prefix: str) -> list[str]:
    """Write ``df`` under ``tmp`` and move its part files into ``directory`` as
    ``prefix-NNNN.parquet``; returns their names.  Nothing a checkpoint names is
    touched: the names are new, and ``tmp`` is emptied first."""
    shutil.rmtree(tmp, ignore_errors=True)
    outputs.write_table(df, tmp)
    names = _move_parts(tmp, directory, prefix)
    shutil.rmtree(tmp, ignore_errors=True)
    return names


def _move_parts(written: Path, directory: Path, prefix: str) -> list[str]:
    """Move the part files Spark wrote under ``written`` into ``directory`` as
    ``prefix-NNNN.parquet``; returns their names (none when ``written`` has none)."""
    directory.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for index, part in enumerate(sorted(written.glob("part-*.parquet"))):
        name = f"{prefix}-{index:04d}.parquet"
        os.replace(part, directory / name)
        names.append(name)
    return names


def read_table(step: StepState, table: str, schema: Any) -> DataFrame:
    assert step.tables is not None
    files = step.tables.get(table) or step.cp.tables.get(table, ())
    if not files:
        return step.spark.createDataFrame([], schema)
    return step.spark.read.schema(schema).parquet(*(str(step.out / table / f) for f in files))


#: The aggregate tables a step rewrites whole (each a few rows per queue).
SMALL_TABLES = ("send_delays", "malformed", "queue_summary", "advice")


def fetch_small(
    step: StepState, df: DataFrame, table: str
) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """Fetch ``table``'s rows (one job), write them as the step's file of it; returns
    the table's files and its rows for the report."""
    rows = df.toArrow()
    name = f"r{step.batch:08d}-0000.parquet"
    outputs.write_arrow(rows, step.out / table, name)
    return (name,), outputs.arrow_rows(rows)


def compact(spark: SparkSession, out: Path, cp: Checkpoint) -> Checkpoint:
    """Rewrite a table's settled step files, once past a few dozen, into one.

    The compacted copies carry the step's number; the checkpoint that
    names them is committed by the caller and the originals are deleted
    only after that.
    """
    tables = dict(cp.tables)
    for table in INTERVAL_TABLES:
        # The step files since the last compaction (the compacted ones stay).
        settled = [f for f in tables[table] if f.startswith("b") and "c-" not in f]
        if len(settled) > _COMPACT_AFTER:
            df = spark.read.schema(INTERVAL_SCHEMAS[table]).parquet(
                *(str(out / table / f) for f in settled)
            )
            tmp = out / STATE_DIR / "tmp" / f"{table}-compact"
            names = write_parts(df.coalesce(1), tmp, out / table, f"b{cp.batch:08d}c")
            tables[table] = (*names, *(f for f in tables[table] if f not in settled))
    return replace(cp, tables=tables)
