"""Incremental and live analysis: ``rabbitflow-analyze --incremental`` and ``--follow``.

Each step reads only what was added to the inputs since the last committed
step (new files, lines appended to files already read: see
:mod:`rabbitflow_pipeline.offsets`), parses it exactly as the batch job
does, pairs it with the stored state of the intervals still open, and
updates the tables and ``report.html``.  The final tables equal what the
batch job writes for the whole input.  What is kept where is described in
:mod:`rabbitflow_pipeline.checkpoint`.

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

**Aggregates.**  Nothing is re-read from earlier steps but the episodes
(for the exact duration percentiles and the report's timeline): the send
delays and malformed counts are merged into the stored tables, blocked
channels are stored per channel with their settled block counts, and the
report's histograms and totals are counters in the checkpoint.

**Commit.**  A step writes everything under names of its own step number
and then replaces ``commit.json`` (the one commit point); whatever a
killed step left that the checkpoint does not name is deleted by the
next step, which starts the killed step again from its staged copy.
Nothing is read twice and nothing is lost.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline import transforms as tf
from rabbitflow_pipeline.checkpoint import (
    INTERVAL_TABLES,
    STATE_DIR,
    Checkpoint,
    clean,
    commit,
    load_checkpoint,
    load_manifest,
    source_column,
    stage,
    staged_paths,
    write_text_atomically,
)
from rabbitflow_pipeline.offsets import Tracked
from rabbitflow_pipeline.report import ReportData, render_report
from rabbitflow_pipeline.schemas import (
    CHANNEL_BLOCKS_SCHEMA,
    CORRUPT_COLUMN,
    EPISODES_SCHEMA,
    EVENT_WIRE_SCHEMA,
    LINES_SCHEMA,
    QUEUE_LIMITS_SCHEMA,
    STORE_EPISODES_SCHEMA,
)

__all__ = [
    "DEFAULT_LATENESS_S",
    "STATE_DIR",
    "Checkpoint",
    "StepResult",
    "follow",
    "load_checkpoint",
    "run_step",
    "write_text_atomically",
]

#: Default seconds an event may arrive after newer events of another file.
DEFAULT_LATENESS_S = 60.0

#: Settled file sets past which a step compacts a table's into one.
_COMPACT_AFTER = 48
#: Threads submitting a step's independent Spark jobs (as the batch job does).
_JOB_THREADS = 4

_SCHEMAS = {
    "episodes": EPISODES_SCHEMA,
    "channel_blocks": CHANNEL_BLOCKS_SCHEMA,
    "store_episodes": STORE_EPISODES_SCHEMA,
}
_KIND_OF = {"episodes": "queue", "channel_blocks": "channel", "store_episodes": "store"}
_SELECT: dict[str, Callable[[DataFrame], DataFrame]] = {
    "episodes": tf.episodes_from,
    "channel_blocks": tf.channel_blocks_from,
    "store_episodes": tf.store_episodes_from,
}
_CHANNELS_SCHEMA = (
    "vhost string, queue string, source string, connection long, channel long, blocks long"
)
_MALFORMED_SCHEMA = "log string, source string, reason string, count long"
#: State rows: the opening event of an open interval, an unsettled event,
#: the last transition of a queue (only for the duplicate test), a new event.
_OPEN, _PENDING, _CONTEXT, _NEW = "open", "pending", "context", "new"


@dataclass(frozen=True)
class StepResult:
    """What one step did."""

    out: Path
    batch: int
    #: False when there was no new input (nothing was written).
    changed: bool
    new_bytes: int
    events: int
    malformed: int
    ignored: int
    late: int
    episodes: int
    open_episodes: int
    seconds: float
    phases: Mapping[str, float]
    malformed_reasons: Sequence[tuple[str, int]] = ()

    @property
    def all_malformed(self) -> bool:
        """Every non-blank event-log line so far was malformed (and there was at least one)."""
        return self.malformed > 0 and self.events == 0 and self.ignored == 0


def _lower(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _higher(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


@dataclass
class _Step:
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
    small: dict[str, DataFrame] | None = None

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
        end = _higher(self.cp.window_end_us, self.counts["end_us"])
        frontier = self.cp.frontier_us
        if end is not None:
            frontier = _higher(frontier, end - self.lateness_us)
        return frontier


def _parse_events(step: _Step) -> DataFrame:
    """Staged event-log lines → classified events (the batch job's reader and parser)."""
    parts = step.of_kind("events")
    spark = step.spark
    if parts:
        raw = (
            spark.read.schema(EVENT_WIRE_SCHEMA)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
            .json(staged_paths(step.out, step.batch, parts))
        )
        raw = raw.select("*", source_column(parts).alias("source"))
    else:
        raw = spark.createDataFrame([], EVENT_WIRE_SCHEMA).select("*", F.lit("").alias("source"))
    return tf.classify_events(raw)


def _event_metrics() -> list[Column]:
    """What a step counts while it writes its parsed events.

    No value of the step's own in them (nor in the parse): the parse's
    generated code, large and slow to compile, is then the same at every
    step, and Spark reuses it.
    """
    good_us = F.when(F.col("malformed_reason").isNull(), F.unix_micros("ts"))
    return [
        F.count(F.lit(1)).alias("lines"),
        F.count(F.when(tf.is_malformed(F.col("malformed_reason")), 1)).alias("malformed"),
        F.count(F.when(F.col("malformed_reason") == tf.IGNORED, 1)).alias("ignored"),
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


def _events_dir(step: _Step) -> Path:
    return step.out / "events" / f"batch={step.batch}"


def _parse(step: _Step) -> None:
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


def _new_events(step: _Step) -> DataFrame:
    """The step's parsed events from the event store, ``seq`` made unique across steps."""
    schema = _event_schema(step.spark)
    stored = T.StructType([*schema.fields, T.StructField("batch", T.IntegerType())])
    events = (
        step.spark.read.schema(stored)
        .option("basePath", str(step.out / "events"))
        .parquet(str(_events_dir(step)))
    )
    return events.withColumn("seq", _global_seq()).drop("batch")


def _late(step: _Step, events: DataFrame) -> int:
    """New good events older than the last step's frontier (paired where they land)."""
    if step.cp.frontier_us is None:
        return 0
    late = F.col("malformed_reason").isNull() & (F.unix_micros("ts") <= step.cp.frontier_us)
    return events.where(late).count()


def _parse_client(step: _Step) -> None:
    """The new client records, kept, and the delay histogram counted over them."""
    parts = step.of_kind("client")
    if not parts:
        return
    lines = step.spark.read.text(staged_paths(step.out, step.batch, parts)).select(
        "value", source_column(parts).alias("source")
    )
    step.client = step.kept.keep(tf.parse_client_lines(lines))
    row = step.client.agg(*tf.histogram_metrics(tf.delay_seconds(), "delay")).first()
    step.delay_counts = {} if row is None else {k: int(v) for k, v in row.asDict().items()}


def _empty_client(spark: SparkSession) -> DataFrame:
    return tf.parse_client_lines(spark.createDataFrame([], LINES_SCHEMA))


def _pair(step: _Step) -> None:
    """Pair the stored state with the new events in one pass; keep the intervals."""
    spark = step.spark
    schema = _event_schema(spark)
    fresh = _new_events(step)
    late = step.pool.submit(_late, step, fresh)
    new_events = fresh.withColumn("_role", F.lit(_NEW))
    if step.cp.state is not None:
        state_schema = T.StructType([*schema.fields, T.StructField("_role", T.StringType())])
        previous = spark.read.schema(state_schema).parquet(str(step.root / step.cp.state))
        pool = previous.unionByName(new_events)
    else:
        pool = new_events
    frontier = step.frontier_us
    settled = _settled_event(frontier)
    context = (F.col("_role") == F.lit(_CONTEXT)).alias("_is_context")
    candidates = tf.pair_candidates(pool.select("*", context), context="_is_context")
    intervals = tf.finish_intervals(candidates, keep_seq=True)
    # The pairing is kept as it is; the frontier, a value of this step's own,
    # is applied to the kept rows in a small job of its own (see _event_metrics).
    paired = step.kept.keep(intervals)
    step.intervals = step.kept.keep(paired.withColumn("_final", _final_test(step)))
    step.state = f"state/v{step.batch:08d}"
    opened = (
        _provisional(step)
        .where(F.col("kind").isin("queue", "channel", "store"))
        .select(F.col("start_seq").alias("seq"))
    )
    state = step.pool.submit(_write_state, step, pool, settled, opened)
    counted = step.pool.submit(_step_counts, step)
    written = [step.pool.submit(_write_intervals, step, table) for table in INTERVAL_TABLES]
    step.tables = dict(done.result() for done in written)
    state.result()
    counted.result()
    assert step.counts is not None
    step.counts["late"] = late.result()


def _final_test(step: _Step) -> Column:
    """A kept interval is final once its end is settled (a malformed line's count at once)."""
    final = F.col("kind") == F.lit("malformed")
    frontier = step.frontier_us
    if frontier is not None:
        final = final | F.coalesce(F.unix_micros("end") <= F.lit(frontier), F.lit(False))
    return final


def _final(step: _Step) -> DataFrame:
    assert step.intervals is not None
    return step.intervals.where(F.col("_final"))


def _provisional(step: _Step) -> DataFrame:
    assert step.intervals is not None
    return step.intervals.where(~F.col("_final"))


def _event_schema(spark: SparkSession) -> T.StructType:
    """The schema of a parsed event (:func:`~rabbitflow_pipeline.transforms.classify_events`)."""
    empty = spark.createDataFrame([], EVENT_WIRE_SCHEMA).select("*", F.lit("").alias("source"))
    return tf.classify_events(empty).schema


def _settled_event(frontier_us: int | None) -> Column:
    if frontier_us is None:
        return F.lit(True)
    return F.col("malformed_reason").isNotNull() | (F.unix_micros("ts") <= F.lit(frontier_us))


def _write_state(step: _Step, pool: DataFrame, settled: Column, opened: DataFrame) -> None:
    """The next step's state: open starts, unsettled events, each queue's last transitions."""
    role = F.col("_role")
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
    columns = [c for c in pool.columns if c != "_role"]
    last = (
        transitions.groupBy("vhost", "queue", "code")
        .agg(F.max_by(F.struct(*columns), F.struct("ts", "seq")).alias("_e"))
        .select("_e.*")
        .join(opened, "seq", "left_anti")
    )
    state = (
        starts.drop("_role")
        .withColumn("_role", F.lit(_OPEN))
        .unionByName(pending.drop("_role").withColumn("_role", F.lit(_PENDING)))
        .unionByName(last.select(*columns).withColumn("_role", F.lit(_CONTEXT)))
    )
    assert step.state is not None
    state.write.mode("overwrite").parquet(str(step.root / step.state))


def _step_counts(step: _Step) -> None:
    """Rows per table and block-duration histograms, settled and provisional, in one job."""
    assert step.intervals is not None
    final = F.col("_final")
    block = F.col("kind") == F.lit("channel")
    metrics = []
    for name, rows in (("final", final), ("prov", ~final)):
        for table, kind in _KIND_OF.items():
            metrics.append(
                F.count(F.when(rows & (F.col("kind") == F.lit(kind)), 1)).alias(f"{name}_{table}")
            )
        duration = F.when(rows & block, F.col("duration_s"))
        metrics.extend(tf.histogram_metrics(duration, f"{name}_block"))
    open_episode = ~final & F.col("open") & (F.col("kind") == F.lit("queue"))
    metrics.append(F.count(F.when(open_episode, 1)).alias("open_episodes"))
    row = step.intervals.agg(*metrics).first()
    assert row is not None
    step.step_counts = row.asDict()


def _write_intervals(step: _Step, table: str) -> tuple[str, tuple[str, ...]]:
    """This step's settled and provisional rows of ``table``; returns its current files."""
    select = _SELECT[table]
    kept = [f for f in step.cp.tables.get(table, ()) if f.startswith("b")]
    names = _add_files(step, select(_final(step)), table, f"b{step.batch:08d}")
    names += _add_files(step, select(_provisional(step)), table, f"p{step.batch:08d}")
    return table, (*kept, *names)


def _add_files(step: _Step, df: DataFrame, table: str, prefix: str) -> list[str]:
    """Write ``df`` and move its part files into ``out/table`` as ``prefix-NNNN.parquet``."""
    tmp = step.root / "tmp" / f"{table}-{prefix}"
    shutil.rmtree(tmp, ignore_errors=True)
    # One file per step and table: a step adds a few percent of the rows.
    outputs.write_table(df.coalesce(1), tmp)
    directory = step.out / table
    directory.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for index, part in enumerate(sorted(tmp.glob("part-*.parquet"))):
        name = f"{prefix}-{index:04d}.parquet"
        os.replace(part, directory / name)
        names.append(name)
    shutil.rmtree(tmp, ignore_errors=True)
    return names


def _read_table(step: _Step, table: str, schema: Any) -> DataFrame:
    assert step.tables is not None
    files = step.tables.get(table) or step.cp.tables.get(table, ())
    if not files:
        return step.spark.createDataFrame([], schema)
    return step.spark.read.schema(schema).parquet(*(str(step.out / table / f) for f in files))


def _aggregates(step: _Step, queue_limits: Any) -> None:
    """Summary, advice, send delays and malformed counts from the stored state and this step."""
    spark, intervals = step.spark, step.intervals
    assert intervals is not None
    assert step.tables is not None
    window = outputs.window_frame(spark, *_window(step))
    client = step.client if step.client is not None else _empty_client(spark)
    delays = tf.merge_send_delays(
        _previous(
            step, "send_delays", tf.send_delays(tf.client_flow_records(client)).schema
        ).unionByName(tf.send_delays(tf.client_flow_records(client)))
    )
    gateway_malformed = (
        intervals.where(F.col("kind") == "malformed")
        .groupBy("source", "reason")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(F.lit("gateway").alias("log"), "source", "reason", "count")
    )
    client_malformed = tf.malformed_summary(
        spark.createDataFrame([], "source string, malformed_reason string"), client
    )
    malformed = (
        _previous(step, "malformed", _MALFORMED_SCHEMA)
        .unionByName(gateway_malformed)
        .unionByName(client_malformed)
        .groupBy("log", "source", "reason")
        .agg(F.sum("count").alias("count"))
    )
    step.channels = f"channels/v{step.batch:08d}"
    channels = _stored_channels(step).unionByName(
        tf.blocked_channels(tf.channel_blocks_from(_final(step)))
    )
    kept_delays = step.pool.submit(step.kept.keep, delays)
    kept_malformed = step.pool.submit(step.kept.keep, malformed)
    channels_done = step.pool.submit(
        outputs.write_table,
        channels.groupBy("vhost", "queue", "source", "connection", "channel").agg(
            F.sum("blocks").alias("blocks")
        ),
        step.root / step.channels,
    )
    episodes = _read_table(step, "episodes", EPISODES_SCHEMA)
    stats = step.kept.keep(tf.queue_episode_stats(episodes, window))
    channels_done.result()
    provisional = tf.blocked_channels(tf.channel_blocks_from(_provisional(step)))
    stored = spark.read.schema(_CHANNELS_SCHEMA).parquet(str(step.root / step.channels))
    summary = tf.queue_summary_of_channels(stats, stored.unionByName(provisional), window)
    limits = None
    if queue_limits is not None:
        limits = spark.createDataFrame(list(queue_limits), QUEUE_LIMITS_SCHEMA)
    small_delays = kept_delays.result()
    capacities = small_delays.where(
        F.col("capacity").isNotNull() & F.col("destination").isNotNull()
    ).select("destination", "producer", "capacity")
    advice = tf.advice_from(stats, None, limits, capacities=capacities)
    kept_summary = step.pool.submit(step.kept.keep, summary)
    kept_advice = step.pool.submit(step.kept.keep, advice)
    step.small = {
        "send_delays": small_delays,
        "malformed": kept_malformed.result(),
        "queue_summary": kept_summary.result(),
        "advice": kept_advice.result(),
    }
    written = {
        table: step.pool.submit(_add_files, step, df, table, f"r{step.batch:08d}")
        for table, df in step.small.items()
    }
    for table, done in written.items():
        step.tables[table] = tuple(done.result())


def _stored_channels(step: _Step) -> DataFrame:
    if step.cp.channels is None:
        return step.spark.createDataFrame([], _CHANNELS_SCHEMA)
    return step.spark.read.schema(_CHANNELS_SCHEMA).parquet(str(step.root / step.cp.channels))


def _previous(step: _Step, table: str, schema: Any) -> DataFrame:
    files = step.cp.tables.get(table, ())
    if not files:
        return step.spark.createDataFrame([], schema)
    return step.spark.read.schema(schema).parquet(*(str(step.out / table / f) for f in files))


def _window(step: _Step) -> tuple[int | None, int | None]:
    assert step.counts is not None
    return (
        _lower(step.cp.window_start_us, step.counts["start_us"]),
        _higher(step.cp.window_end_us, step.counts["end_us"]),
    )


def _counters(step: _Step) -> dict[str, int]:
    """The checkpoint's counters after this step (settled rows, histograms)."""
    assert step.step_counts is not None
    counters = dict(step.cp.counters)
    for key, value in step.step_counts.items():
        if key.startswith("final_"):
            name = key.removeprefix("final_")
            counters[name] = counters.get(name, 0) + int(value)
    for key, value in (step.delay_counts or {}).items():
        counters[key] = counters.get(key, 0) + int(value)
    return counters


def _histogram(counters: Mapping[str, int], extra: Mapping[str, Any], name: str) -> dict[str, int]:
    edges = len(tf.DEFAULT_HISTOGRAM_EDGES_S)
    return {
        f"{name}_{i}": int(counters.get(f"{name}_{i}", 0)) + int(extra.get(f"prov_{name}_{i}", 0))
        for i in range(edges)
    }


def _report(step: _Step, counters: Mapping[str, int], totals: Mapping[str, int], **kw: Any) -> None:
    """Collect the report's rows (small tables, counters) and replace ``report.html``."""
    assert step.small is not None
    assert step.step_counts is not None
    spark, extra = step.spark, step.step_counts
    small = {name: step.pool.submit(outputs.rows, df) for name, df in step.small.items()}
    stores = _read_table(step, "store_episodes", STORE_EPISODES_SCHEMA)
    store_rows = step.pool.submit(outputs.rows, stores.orderBy("start").limit(50))
    open_now = None
    if kw["live"]:
        provisional = _provisional(step)
        open_now = step.pool.submit(
            outputs.rows,
            outputs.open_now(
                tf.episodes_from(provisional),
                tf.channel_blocks_from(provisional),
                tf.store_episodes_from(provisional),
            ),
        )
    summary_rows = sorted(
        small["queue_summary"].result(),
        key=lambda r: (-(r["time_overfull_s"] or 0.0), r["vhost"], r["queue"]),
    )
    top = summary_rows[: outputs.TIMELINE_QUEUES]
    window = _window(step)
    episodes = _read_table(step, "episodes", EPISODES_SCHEMA)
    timeline = outputs.timeline_rows(spark, episodes, outputs.window_frame(spark, *window), top)
    blocks = _histogram(counters, extra, "block")
    delays = {f"delay_{i}": counters.get(f"delay_{i}", 0) for i in range(len(blocks))}
    shown = {
        "events": totals["events"],
        "malformed lines": totals["malformed lines"],
        "queues with episodes": sum(1 for r in summary_rows if r["flow_stopped_count"] > 0),
        "flow episodes": totals["flow episodes"],
        "open episodes": totals["open episodes"],
        "channel blocks": counters.get("channel_blocks", 0) + int(extra["prov_channel_blocks"]),
        "store episodes": counters.get("store_episodes", 0) + int(extra["prov_store_episodes"]),
    }
    if kw["ignored"]:
        shown["other Broker-J lines (not analysed)"] = kw["ignored"]
    data = ReportData(
        inputs=[*kw["event_paths"], *kw["client_paths"]],
        window_start=outputs.utc(window[0]),
        window_end=outputs.utc(window[1]),
        totals=shown,
        summary=summary_rows[:50],
        timeline=timeline,
        timeline_buckets=outputs.TIMELINE_BUCKETS,
        timeline_queues=[{"vhost": r["vhost"], "queue": r["queue"]} for r in top],
        block_histogram=tf.histogram_rows(blocks, "block"),
        delay_histogram=tf.histogram_rows(delays, "delay"),
        advice=sorted(
            small["advice"].result(),
            key=lambda r: (r["stop_ok"] is not False, -(r["episodes"] or 0)),
        )[:100],
        malformed=sorted(small["malformed"].result(), key=lambda r: -int(r["count"]))[:200],
        store_episodes=store_rows.result(),
        send_delays=sorted(
            small["send_delays"].result(),
            key=lambda r: (r["longest_delay_ms"] is None, -(r["longest_delay_ms"] or 0)),
        )[:20],
        open_now=None if open_now is None else open_now.result(),
    )
    write_text_atomically(step.out / "report.html", render_report(data))


def run_step(
    spark: SparkSession,
    event_paths: Sequence[str],
    out: Path,
    *,
    client_paths: Sequence[str] = (),
    queue_limits: Iterable[tuple[str, str, int | None, int | None]] | None = None,
    lateness_s: float = DEFAULT_LATENESS_S,
    live: bool = False,
    hook: Callable[[str], None] | None = None,
) -> StepResult:
    """One incremental step: read what is new, update the state, tables and report, commit.

    ``live`` puts the currently open episodes at the top of the report
    (``--follow``).  ``hook`` is called with the name of each stage
    (``staged``, ``parsed``, ``paired``, ``tables``, ``report``,
    ``committed``) as the step passes it; a test raises from it to kill
    the step there.

    Raises:
        ValueError: ``lateness_s`` is negative.
    """
    if lateness_s < 0:
        raise ValueError(f"lateness must not be negative, got {lateness_s}")
    started = time.monotonic()
    phases: dict[str, float] = {}
    mark = started

    def passed(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = now - mark
        mark = now
        if hook is not None:
            hook(name)

    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    cp = load_checkpoint(out)
    manifest = load_manifest(out, cp.batch + 1)
    clean(out, cp, keep_staging=cp.batch + 1 if manifest is not None else None)
    if manifest is None:
        patterns = [("events", p) for p in event_paths] + [("client", p) for p in client_paths]
        manifest = stage(out, cp, patterns)
    parts = manifest["parts"]
    if not parts and cp.batch >= 0:
        # Nothing new: the tables, state and report stay exactly as they are.
        return _unchanged(out, cp, started)
    passed("staged")
    kept = outputs.Kept()
    session = _step_session(spark)
    try:
        with ThreadPoolExecutor(_JOB_THREADS, thread_name_prefix="step") as pool:
            step = _Step(session, out, cp, parts, int(lateness_s * 1_000_000), kept, pool)
            _parse(step)
            passed("parsed")
            _pair(step)
            passed("paired")
            _aggregates(step, queue_limits)
            passed("tables")
            checkpoint = _next_checkpoint(step, manifest)
            _report(
                step,
                checkpoint.counters,
                _totals(step, checkpoint),
                event_paths=event_paths,
                client_paths=client_paths,
                ignored=checkpoint.ignored,
                live=live,
            )
            passed("report")
            reasons = _reasons(step)
    finally:
        kept.release()
    checkpoint = _compact(spark, out, checkpoint)
    commit(out, checkpoint)
    passed("committed")
    clean(out, checkpoint, keep_staging=None)
    totals = _totals(step, checkpoint)
    return StepResult(
        out=out,
        batch=checkpoint.batch,
        changed=True,
        new_bytes=sum(int(p["end"]) - int(p["start"]) for p in parts),
        events=totals["events"],
        malformed=checkpoint.malformed,
        ignored=checkpoint.ignored,
        late=checkpoint.late,
        episodes=totals["flow episodes"],
        open_episodes=totals["open episodes"],
        seconds=time.monotonic() - started,
        phases=phases,
        malformed_reasons=reasons,
    )


def _step_session(spark: SparkSession) -> SparkSession:
    """The session a step runs its jobs in: ``spark``'s, without adaptive execution.

    A step is a few dozen small queries; adaptive execution runs each of
    their shuffle stages as a job of its own and plans the rest again after
    it, which cost more than the step's work (measured: 61 jobs per step).
    A new session of the same application (classic Spark only; a Spark
    Connect session is used as it is), so the caller's settings stay as
    they are.
    """
    if _is_connect(spark):
        return spark
    session = spark.newSession()
    session.conf.set("spark.sql.adaptive.enabled", "false")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    return session


def _next_checkpoint(step: _Step, manifest: Mapping[str, Any]) -> Checkpoint:
    assert step.counts is not None
    assert step.tables is not None
    counts, cp = step.counts, step.cp
    start_us, end_us = _window(step)
    return Checkpoint(
        batch=step.batch,
        files=tuple(Tracked.from_json(f) for f in manifest["files"]),
        frontier_us=step.frontier_us,
        window_start_us=start_us,
        window_end_us=end_us,
        lines=cp.lines + int(counts["lines"]),
        malformed=cp.malformed + int(counts["malformed"]),
        ignored=cp.ignored + int(counts["ignored"]),
        late=cp.late + int(counts["late"]),
        state=step.state,
        channels=step.channels,
        tables=dict(step.tables),
        counters=_counters(step),
    )


def _totals(step: _Step, checkpoint: Checkpoint) -> dict[str, int]:
    assert step.step_counts is not None
    return {
        "events": checkpoint.lines - checkpoint.malformed - checkpoint.ignored,
        "malformed lines": checkpoint.malformed,
        "flow episodes": checkpoint.counters.get("episodes", 0)
        + int(step.step_counts["prov_episodes"]),
        "open episodes": int(step.step_counts["open_episodes"]),
    }


def _reasons(step: _Step) -> tuple[tuple[str, int], ...]:
    assert step.small is not None
    per_reason: dict[str, int] = {}
    for row in step.small["malformed"].where(F.col("log") == "gateway").collect():
        per_reason[row["reason"]] = per_reason.get(row["reason"], 0) + int(row["count"])
    return tuple(sorted(per_reason.items(), key=lambda item: (-item[1], item[0])))


def follow(
    spark: SparkSession,
    event_paths: Sequence[str],
    out: Path,
    *,
    trigger_s: float,
    stop: threading.Event,
    on_step: Callable[[StepResult], None] | None = None,
    **options: Any,
) -> None:
    """Run :func:`run_step` (live) every ``trigger_s`` seconds until ``stop`` is set.

    A step starts ``trigger_s`` after the previous one started, or at once
    when that one took longer; the step under way when ``stop`` is set
    finishes (and commits) first.  ``on_step`` sees every step's result.

    Raises:
        ValueError: ``trigger_s`` is not positive.
    """
    if not trigger_s > 0:
        raise ValueError(f"trigger must be positive, got {trigger_s}")
    while not stop.is_set():
        started = time.monotonic()
        result = run_step(spark, event_paths, out, live=True, **options)
        if on_step is not None:
            on_step(result)
        stop.wait(max(0.0, trigger_s - (time.monotonic() - started)))


def _unchanged(out: Path, cp: Checkpoint, started: float) -> StepResult:
    return StepResult(
        out=out,
        batch=cp.batch,
        changed=False,
        new_bytes=0,
        events=cp.lines - cp.malformed - cp.ignored,
        malformed=cp.malformed,
        ignored=cp.ignored,
        late=cp.late,
        episodes=-1,
        open_episodes=-1,
        seconds=time.monotonic() - started,
        phases={},
    )


def _compact(spark: SparkSession, out: Path, cp: Checkpoint) -> Checkpoint:
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
            df = spark.read.schema(_SCHEMAS[table]).parquet(
                *(str(out / table / f) for f in settled)
            )
            tmp = out / STATE_DIR / "tmp" / f"{table}-compact"
            shutil.rmtree(tmp, ignore_errors=True)
            outputs.write_table(df.coalesce(1), tmp)
            names = []
            for index, part in enumerate(sorted(tmp.glob("part-*.parquet"))):
                name = f"b{cp.batch:08d}c-{index:04d}.parquet"
                os.replace(part, out / table / name)
                names.append(name)
            shutil.rmtree(tmp, ignore_errors=True)
            tables[table] = (*names, *(f for f in tables[table] if f not in settled))
    return replace(cp, tables=tables)
