"""Incremental and live analysis: ``rabbitflow-analyze --incremental`` and ``--follow``.

Each step reads only what was added to the inputs since the last committed
step (new files, lines appended to files already read: see
:mod:`rabbitflow_pipeline.offsets`), parses it exactly as the batch job
does, pairs it with the stored state of the episodes still open, and
updates the tables and ``report.html``.  The final tables equal what the
batch job writes for the whole input.

Layout under ``--out`` (everything the step keeps is under ``_state``)::

    _state/commit.json            the checkpoint: offsets, counters, what is current
    _state/staging/batch-N/       the new lines of step N, copied before parsing
    _state/state/vN/              after step N: the opening event of every open
                                  interval and the events not yet settled
    _state/malformed/bN/          malformed lines of step N, counted per source/reason
    _state/client/bN/             client records parsed in step N
    events/batch=N/               the parsed events of step N (Parquet event store)
    episodes/ channel_blocks/ store_episodes/
                                  one file set per step of settled (closed) rows,
                                  plus the current step's provisional rows
    queue_summary/ advice/ send_delays/ malformed/
                                  rewritten each step from the stored state
    report.html                   replaced atomically each step

**Settling.**  Events of one key may come from several files (several
gateways log the same queue), and one file may be read further than
another.  An event is *settled* once it is at least ``lateness`` older
than the newest event seen; only settled events are paired into the
stored state, so an event of another file that arrives up to
``lateness`` late still falls into its place.  The newer, unsettled
events are paired afresh at every step with the open intervals
(provisional rows, replaced at the next step).  An event that arrives
later than that (``late`` in the result) is paired where it lands.

**Commit.**  A step writes everything under names of its own step number
and then replaces ``commit.json`` (the one commit point); whatever a
killed step left that the checkpoint does not name is deleted by the
next step, which starts the killed step again from its staged copy.
Nothing is read twice and nothing is lost.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rabbitflow_pipeline import transforms as tf
from rabbitflow_pipeline.offsets import Tracked, copy_range, observe, plan_reads
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

#: Directory under ``--out`` holding the checkpoint and the stored state.
STATE_DIR = "_state"
#: Default seconds an event may arrive after newer events of another file.
DEFAULT_LATENESS_S = 60.0

_COMMIT = "commit.json"
_MANIFEST = "_manifest.json"
#: Part directories (or table file sets) past which a step compacts them into one.
_COMPACT_AFTER = 48
_TIMELINE_BUCKETS = 240
_TIMELINE_QUEUES = 30
_EPOCH = dt.datetime(1970, 1, 1)

#: The interval tables: settled rows are appended per step, open ones replaced.
_INTERVAL_TABLES: dict[str, tuple[Any, Callable[[DataFrame], DataFrame]]] = {
    "episodes": (EPISODES_SCHEMA, tf.episodes_from),
    "channel_blocks": (CHANNEL_BLOCKS_SCHEMA, tf.channel_blocks_from),
    "store_episodes": (STORE_EPISODES_SCHEMA, tf.store_episodes_from),
}
_REWRITTEN_TABLES = ("queue_summary", "advice", "send_delays", "malformed")
_INTERVAL_KINDS = ("queue", "channel", "store")


@dataclass(frozen=True)
class Checkpoint:
    """What the last committed step left: the content of ``_state/commit.json``."""

    batch: int = -1
    files: tuple[Tracked, ...] = ()
    next_seq: int = 0
    frontier_us: int | None = None
    window_start_us: int | None = None
    window_end_us: int | None = None
    lines: int = 0
    malformed: int = 0
    ignored: int = 0
    late: int = 0
    #: ``_state``-relative directory of the open starts and unsettled events.
    state: str | None = None
    malformed_parts: tuple[str, ...] = ()
    client_parts: tuple[str, ...] = ()
    #: Table name to its current files (relative to the table directory).
    tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "files": [f.to_json() for f in self.files],
            "next_seq": self.next_seq,
            "frontier_us": self.frontier_us,
            "window_start_us": self.window_start_us,
            "window_end_us": self.window_end_us,
            "lines": self.lines,
            "malformed": self.malformed,
            "ignored": self.ignored,
            "late": self.late,
            "state": self.state,
            "malformed_parts": list(self.malformed_parts),
            "client_parts": list(self.client_parts),
            "tables": {k: list(v) for k, v in self.tables.items()},
        }

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Checkpoint:
        return Checkpoint(
            batch=int(doc["batch"]),
            files=tuple(Tracked.from_json(f) for f in doc["files"]),
            next_seq=int(doc["next_seq"]),
            frontier_us=doc["frontier_us"],
            window_start_us=doc["window_start_us"],
            window_end_us=doc["window_end_us"],
            lines=int(doc["lines"]),
            malformed=int(doc["malformed"]),
            ignored=int(doc["ignored"]),
            late=int(doc["late"]),
            state=doc["state"],
            malformed_parts=tuple(doc["malformed_parts"]),
            client_parts=tuple(doc["client_parts"]),
            tables={k: tuple(v) for k, v in doc["tables"].items()},
        )


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


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(out: Path) -> Checkpoint:
    """The last committed checkpoint under ``out`` (an empty one before the first step)."""
    path = out / STATE_DIR / _COMMIT
    if not path.exists():
        return Checkpoint()
    return Checkpoint.from_json(json.loads(path.read_text(encoding="utf-8")))


def _commit(out: Path, checkpoint: Checkpoint) -> None:
    write_text_atomically(out / STATE_DIR / _COMMIT, json.dumps(checkpoint.to_json(), indent=1))


def _batch_of(name: str) -> int | None:
    return int(name) if name.isdigit() else None


def _clean(out: Path, checkpoint: Checkpoint, *, keep_staging: int | None) -> None:
    """Delete whatever the checkpoint does not name (a killed step's leftovers, old state)."""
    root = out / STATE_DIR
    named = {checkpoint.state, *checkpoint.malformed_parts, *checkpoint.client_parts}
    for area in ("state", "malformed", "client", "tmp"):
        base = root / area
        if not base.is_dir():
            continue
        for child in base.iterdir():
            if f"{area}/{child.name}" not in named:
                shutil.rmtree(child, ignore_errors=True)
    staging = root / "staging"
    if staging.is_dir():
        for child in staging.iterdir():
            if keep_staging is None or child.name != f"batch-{keep_staging:08d}":
                shutil.rmtree(child, ignore_errors=True)
    events = out / "events"
    if events.is_dir():
        for child in events.iterdir():
            batch = _batch_of(child.name.removeprefix("batch="))
            if child.name.startswith("batch=") and (batch is None or batch > checkpoint.batch):
                shutil.rmtree(child, ignore_errors=True)
    for table in (*_INTERVAL_TABLES, *_REWRITTEN_TABLES):
        directory = out / table
        if not directory.is_dir():
            continue
        listed = set(checkpoint.tables.get(table, ()))
        for child in directory.iterdir():
            if child.name not in listed:
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def _uri(path: str) -> str:
    """A path as Spark's ``input_file_name()`` names it (``file:///dir/file``)."""
    return Path(path).as_uri()


def _stage(
    out: Path, checkpoint: Checkpoint, patterns: Iterable[tuple[str, str]]
) -> dict[str, Any]:
    """Copy the new whole lines of every input into the next step's staging directory.

    Returns the manifest (also written, last, as ``_manifest.json``); a
    step killed before that starts its staging over.
    """
    batch = checkpoint.batch + 1
    staging = out / STATE_DIR / "staging" / f"batch-{batch:08d}"
    shutil.rmtree(staging, ignore_errors=True)
    reads = plan_reads(checkpoint.files, observe(patterns, checkpoint.files))
    parts: list[dict[str, Any]] = []
    fresh = [r for r in reads if r.end > r.start]
    if fresh:
        staging.mkdir(parents=True)
    for index, read in enumerate(fresh):
        copy_range(read.path, read.start, read.end, staging / f"{index:06d}.log")
        parts.append(
            {
                "index": index,
                "kind": read.kind,
                "source": _uri(read.path),
                "start": read.start,
                "end": read.end,
            }
        )
    manifest = {"batch": batch, "files": [r.tracked.to_json() for r in reads], "parts": parts}
    if fresh:
        write_text_atomically(staging / _MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def _load_manifest(out: Path, batch: int) -> dict[str, Any] | None:
    path = out / STATE_DIR / "staging" / f"batch-{batch:08d}" / _MANIFEST
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def _source_column(out: Path, batch: int, parts: Sequence[Mapping[str, Any]]) -> Column:
    """The original file's URI for a row of a staged copy (as the batch job's ``source``)."""
    index = F.regexp_extract(F.input_file_name(), r"(\d{6})\.log$", 1).cast("int")
    mapping = F.create_map(
        *(x for p in parts for x in (F.lit(int(p["index"])), F.lit(str(p["source"]))))
    )
    return mapping[index]


def _staged_paths(out: Path, batch: int, parts: Sequence[Mapping[str, Any]]) -> list[str]:
    staging = out / STATE_DIR / "staging" / f"batch-{batch:08d}"
    return [str(staging / f"{int(p['index']):06d}.log") for p in parts]


def _parse_events(
    spark: SparkSession, out: Path, batch: int, parts: Sequence[Mapping[str, Any]]
) -> DataFrame:
    """Staged event-log lines → classified events (the batch job's reader and parser)."""
    if parts:
        raw = (
            spark.read.schema(EVENT_WIRE_SCHEMA)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
            .json(_staged_paths(out, batch, parts))
        )
        raw = raw.select("*", _source_column(out, batch, parts).alias("source"))
    else:
        raw = spark.createDataFrame([], EVENT_WIRE_SCHEMA).select("*", F.lit("").alias("source"))
    return tf.classify_events(raw)


def _parse_client(
    spark: SparkSession, out: Path, batch: int, parts: Sequence[Mapping[str, Any]]
) -> DataFrame:
    if parts:
        lines = spark.read.text(_staged_paths(out, batch, parts)).select(
            "value", _source_column(out, batch, parts).alias("source")
        )
    else:
        lines = spark.createDataFrame([], LINES_SCHEMA)
    return tf.parse_client_lines(lines)


def _read_parts(
    spark: SparkSession, root: Path, parts: Sequence[str], empty: DataFrame
) -> DataFrame:
    if not parts:
        return empty
    return spark.read.schema(empty.schema).parquet(*(str(root / p) for p in parts))


def _write_dir(df: DataFrame, path: Path) -> None:
    df.write.mode("overwrite").parquet(str(path))


def _add_files(df: DataFrame, out: Path, table: str, prefix: str) -> list[str]:
    """Write ``df`` and move its part files into ``out/table`` as ``prefix-NNNN.parquet``."""
    tmp = out / STATE_DIR / "tmp" / f"{table}-{prefix}"
    shutil.rmtree(tmp, ignore_errors=True)
    _write_dir(df, tmp)
    directory = out / table
    directory.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for index, part in enumerate(sorted(tmp.glob("part-*.parquet"))):
        name = f"{prefix}-{index:04d}.parquet"
        os.replace(part, directory / name)
        names.append(name)
    shutil.rmtree(tmp, ignore_errors=True)
    return names


def _read_table(
    spark: SparkSession, out: Path, table: str, files: Sequence[str], schema: Any
) -> DataFrame:
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*(str(out / table / f) for f in files))


def _window_frame(spark: SparkSession, start_us: int | None, end_us: int | None) -> DataFrame:
    start = F.lit(start_us).cast("long")
    end = F.lit(end_us).cast("long")
    return spark.range(1).select(
        F.timestamp_micros(start).alias("window_start"),
        F.timestamp_micros(end).alias("window_end"),
        ((end - start) / F.lit(1_000_000.0)).alias("window_s"),
    )


def _utc(micros: int | None) -> dt.datetime | None:
    return None if micros is None else _EPOCH + dt.timedelta(microseconds=micros)


def _lower(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _higher(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


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

    def stage(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = now - mark
        mark = now
        if hook is not None:
            hook(name)

    root = out / STATE_DIR
    root.mkdir(parents=True, exist_ok=True)
    cp = load_checkpoint(out)
    batch = cp.batch + 1
    manifest = _load_manifest(out, batch)
    _clean(out, cp, keep_staging=batch if manifest is not None else None)
    if manifest is None:
        patterns = [("events", p) for p in event_paths] + [("client", p) for p in client_paths]
        manifest = _stage(out, cp, patterns)
    parts = manifest["parts"]
    new_bytes = sum(int(p["end"]) - int(p["start"]) for p in parts)
    if not parts and cp.batch >= 0:
        # Nothing new: the tables, state and report stay exactly as they are.
        return _unchanged(out, cp, started)
    stage("staged")

    # Parse the new event lines once, into the event store.
    event_parts = [p for p in parts if p["kind"] == "events"]
    classified = _parse_events(spark, out, batch, event_parts)
    classified = classified.withColumn("seq", F.col("seq") + F.lit(cp.next_seq))
    events_dir = out / "events" / f"batch={batch}"
    _write_dir(classified, events_dir)
    new_events = spark.read.schema(classified.schema).parquet(str(events_dir))
    good = F.col("malformed_reason").isNull()
    good_us = F.when(good, F.unix_micros("ts"))
    late_test = F.lit(False) if cp.frontier_us is None else good_us <= F.lit(cp.frontier_us)
    counts = new_events.agg(
        F.count(F.lit(1)).alias("lines"),
        F.count(F.when(tf.is_malformed(F.col("malformed_reason")), 1)).alias("malformed"),
        F.count(F.when(F.col("malformed_reason") == tf.IGNORED, 1)).alias("ignored"),
        F.count(F.when(late_test, 1)).alias("late"),
        F.min(good_us).alias("start_us"),
        F.max(good_us).alias("end_us"),
        F.max("seq").alias("max_seq"),
    ).first()
    assert counts is not None
    window_start_us = _lower(cp.window_start_us, counts["start_us"])
    window_end_us = _higher(cp.window_end_us, counts["end_us"])
    frontier_us = cp.frontier_us
    if window_end_us is not None:
        frontier_us = _higher(frontier_us, window_end_us - int(lateness_s * 1_000_000))
    client_parts_new = [p for p in parts if p["kind"] == "client"]
    client_part = f"client/b{batch:08d}"
    client_parts = list(cp.client_parts)
    if client_parts_new:
        _write_dir(_parse_client(spark, out, batch, client_parts_new), root / client_part)
        client_parts.append(client_part)
    stage("parsed")

    # Pair: the stored open starts and the settled events; what is not yet
    # settled stays pending (with the open starts) for the next step.
    empty_events = spark.createDataFrame([], new_events.schema)
    previous = _read_parts(
        spark,
        root,
        [cp.state] if cp.state else [],
        empty_events.withColumn("_pending", F.lit(True)),
    )
    analysed = new_events.where(good | tf.is_malformed(F.col("malformed_reason")))
    pool = previous.where(F.col("_pending")).drop("_pending").unionByName(analysed)
    settles = F.col("malformed_reason").isNotNull()
    if frontier_us is not None:
        settles = settles | (F.unix_micros("ts") <= F.lit(frontier_us))
    else:
        settles = F.lit(True)
    settle = previous.where(~F.col("_pending")).drop("_pending").unionByName(pool.where(settles))
    intervals = tf.finish_intervals(tf.pair_candidates(settle), keep_seq=True).persist()
    try:
        intervals.count()
        still_open = intervals.where(F.col("open") & F.col("kind").isin(*_INTERVAL_KINDS))
        starts = settle.join(still_open.select(F.col("start_seq").alias("seq")), "seq", "left_semi")
        state_part = f"state/v{batch:08d}"
        _write_dir(
            starts.withColumn("_pending", F.lit(False)).unionByName(
                pool.where(~settles).withColumn("_pending", F.lit(True))
            ),
            root / state_part,
        )
        malformed_part = f"malformed/b{batch:08d}"
        _write_dir(
            intervals.where(F.col("kind") == "malformed")
            .groupBy("source", "reason")
            .agg(F.count(F.lit(1)).alias("count")),
            root / malformed_part,
        )
        settled = intervals.where(~F.col("open"))
        tables: dict[str, tuple[str, ...]] = {}
        for table, (_, select) in _INTERVAL_TABLES.items():
            kept = [f for f in cp.tables.get(table, ()) if f.startswith("b")]
            tables[table] = (*kept, *_add_files(select(settled), out, table, f"b{batch:08d}"))
    finally:
        intervals.unpersist()
    state_schema = T.StructType(
        [*new_events.schema.fields, T.StructField("_pending", T.BooleanType())]
    )
    state = spark.read.schema(state_schema).parquet(str(root / state_part))
    provisional = tf.finish_intervals(tf.pair_candidates(state.drop("_pending"))).persist()
    try:
        for table, (_, select) in _INTERVAL_TABLES.items():
            tables[table] = (
                *tables[table],
                *_add_files(select(provisional), out, table, f"p{batch:08d}"),
            )
    finally:
        provisional.unpersist()
    stage("paired")

    malformed_parts = [*cp.malformed_parts, malformed_part]
    frames = {
        table: _read_table(spark, out, table, tables[table], schema)
        for table, (schema, _) in _INTERVAL_TABLES.items()
    }
    window = _window_frame(spark, window_start_us, window_end_us)
    stats = tf.queue_episode_stats(frames["episodes"], window).persist()
    try:
        summary = tf.queue_summary_from(stats, frames["channel_blocks"], window)
        client_empty = tf.parse_client_lines(spark.createDataFrame([], LINES_SCHEMA))
        parsed_client = _read_parts(spark, root, client_parts, client_empty)
        client = tf.client_flow_records(parsed_client)
        limits = None
        if queue_limits is not None:
            limits = spark.createDataFrame(list(queue_limits), QUEUE_LIMITS_SCHEMA)
        gateway_counts = _read_parts(
            spark,
            root,
            malformed_parts,
            spark.createDataFrame([], "source string, reason string, count long"),
        )
        client_malformed = tf.malformed_summary(
            spark.createDataFrame([], "source string, malformed_reason string"), parsed_client
        )
        malformed = (
            gateway_counts.select(F.lit("gateway").alias("log"), "source", "reason", "count")
            .unionByName(client_malformed)
            .groupBy("log", "source", "reason")
            .agg(F.sum("count").alias("count"))
        )
        rewritten = {
            "queue_summary": summary,
            "advice": tf.advice_from(stats, client, limits),
            "send_delays": tf.send_delays(client),
            "malformed": malformed,
        }
        for table, df in rewritten.items():
            tables[table] = tuple(_add_files(df, out, table, f"r{batch:08d}"))
        stage("tables")
    finally:
        stats.unpersist()

    read_back = {t: _read_table(spark, out, t, tables[t], df.schema) for t, df in rewritten.items()}
    totals_row = (
        frames["episodes"]
        .agg(F.count(F.lit(1)).alias("n"), F.count(F.when(F.col("open"), 1)).alias("open"))
        .first()
    )
    assert totals_row is not None
    lines = cp.lines + int(counts["lines"])
    malformed_total = cp.malformed + int(counts["malformed"])
    ignored = cp.ignored + int(counts["ignored"])
    events_total = lines - malformed_total - ignored
    reasons = _rows(
        read_back["malformed"]
        .where(F.col("log") == "gateway")
        .groupBy("reason")
        .agg(F.sum("count").alias("count"))
        .orderBy(F.desc("count"), "reason")
    )
    _report(
        spark,
        out,
        event_paths=event_paths,
        client_paths=client_paths,
        frames=frames,
        tables=read_back,
        parsed_client=parsed_client,
        window=(window_start_us, window_end_us),
        totals={
            "events": events_total,
            "malformed lines": malformed_total,
            "flow episodes": int(totals_row["n"]),
            "open episodes": int(totals_row["open"]),
        },
        ignored=ignored,
        live=live,
    )
    stage("report")

    checkpoint = Checkpoint(
        batch=batch,
        files=tuple(Tracked.from_json(f) for f in manifest["files"]),
        next_seq=max(cp.next_seq, int(counts["max_seq"] or 0) + 1),
        frontier_us=frontier_us,
        window_start_us=window_start_us,
        window_end_us=window_end_us,
        lines=lines,
        malformed=malformed_total,
        ignored=ignored,
        late=cp.late + int(counts["late"]),
        state=state_part,
        malformed_parts=tuple(malformed_parts),
        client_parts=tuple(client_parts),
        tables=tables,
    )
    checkpoint = _compact(spark, out, checkpoint)
    _commit(out, checkpoint)
    stage("committed")
    _clean(out, checkpoint, keep_staging=None)
    return StepResult(
        out=out,
        batch=batch,
        changed=True,
        new_bytes=new_bytes,
        events=events_total,
        malformed=malformed_total,
        ignored=ignored,
        late=checkpoint.late,
        episodes=int(totals_row["n"]),
        open_episodes=int(totals_row["open"]),
        seconds=time.monotonic() - started,
        phases=phases,
        malformed_reasons=tuple((r["reason"], int(r["count"])) for r in reasons),
    )


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
    events = cp.lines - cp.malformed - cp.ignored
    return StepResult(
        out=out,
        batch=cp.batch,
        changed=False,
        new_bytes=0,
        events=events,
        malformed=cp.malformed,
        ignored=cp.ignored,
        late=cp.late,
        episodes=-1,
        open_episodes=-1,
        seconds=time.monotonic() - started,
        phases={},
    )


def _compact(spark: SparkSession, out: Path, cp: Checkpoint) -> Checkpoint:
    """Rewrite settled file sets and part directories grown past a few dozen into one each.

    The compacted copies carry the step's number; the checkpoint that
    names them is committed by the caller and the originals are deleted
    only after that.
    """
    root = out / STATE_DIR
    tables = dict(cp.tables)
    for table, (schema, _) in _INTERVAL_TABLES.items():
        settled = [f for f in tables[table] if f.startswith("b")]
        if len(settled) > _COMPACT_AFTER:
            df = _read_table(spark, out, table, settled, schema)
            names = _add_files(df.coalesce(1), out, table, f"b{cp.batch:08d}c")
            others = [f for f in tables[table] if not f.startswith("b")]
            tables[table] = (*names, *others)
    changes: dict[str, Any] = {"tables": tables}
    for attr, area in (("malformed_parts", "malformed"), ("client_parts", "client")):
        current: tuple[str, ...] = getattr(cp, attr)
        if len(current) > _COMPACT_AFTER:
            df = spark.read.parquet(*(str(root / p) for p in current))
            name = f"{area}/c{cp.batch:08d}"
            _write_dir(df.coalesce(1), root / name)
            changes[attr] = (name,)
    return replace(cp, **changes)


def _report(
    spark: SparkSession,
    out: Path,
    *,
    event_paths: Sequence[str],
    client_paths: Sequence[str],
    frames: Mapping[str, DataFrame],
    tables: Mapping[str, DataFrame],
    parsed_client: DataFrame,
    window: tuple[int | None, int | None],
    totals: Mapping[str, int],
    ignored: int,
    live: bool,
) -> None:
    """Collect the report's rows from the tables and replace ``report.html``."""
    summary = tables["queue_summary"]
    episodes = frames["episodes"]
    blocks = frames["channel_blocks"]
    stores = frames["store_episodes"]
    window_frame = _window_frame(spark, *window)
    # The per-queue tables are small: collected whole, ordered here.
    summary_rows = sorted(
        _rows(summary), key=lambda r: (-(r["time_overfull_s"] or 0.0), r["vhost"], r["queue"])
    )
    top = summary_rows[:_TIMELINE_QUEUES]
    top_frame = spark.createDataFrame(
        [(r["vhost"], r["queue"]) for r in top], "vhost string, queue string"
    )
    advice_rows = sorted(
        _rows(tables["advice"]),
        key=lambda r: (r["stop_ok"] is not False, -(r["episodes"] or 0)),
    )
    malformed_rows = sorted(_rows(tables["malformed"]), key=lambda r: -int(r["count"]))
    delay_rows = sorted(
        _rows(tables["send_delays"]),
        key=lambda r: (r["longest_delay_ms"] is None, -(r["longest_delay_ms"] or 0)),
    )
    block_stats = blocks.agg(
        F.count(F.lit(1)).alias("n"), *tf.histogram_metrics(F.col("duration_s"), "block")
    ).first()
    delay_stats = parsed_client.agg(*tf.histogram_metrics(tf.delay_seconds(), "delay")).first()
    store_rows = _rows(stores.orderBy("start").limit(50))
    store_count = stores.count()
    timeline = _rows(tf.episode_timeline(episodes, window_frame, top_frame, _TIMELINE_BUCKETS))
    open_now = None
    if live:
        open_now = _rows(
            episodes.where(F.col("open"))
            .select(
                F.lit("queue").alias("kind"),
                "vhost",
                "queue",
                F.lit(None).cast("long").alias("connection"),
                F.lit(None).cast("long").alias("channel"),
                "start",
            )
            .unionByName(
                blocks.where(F.col("open")).select(
                    F.lit("channel").alias("kind"),
                    "vhost",
                    "queue",
                    "connection",
                    "channel",
                    "start",
                )
            )
            .unionByName(
                stores.where(F.col("open")).select(
                    F.lit("store").alias("kind"),
                    "vhost",
                    F.lit(None).cast("string").alias("queue"),
                    F.lit(None).cast("long").alias("connection"),
                    F.lit(None).cast("long").alias("channel"),
                    "start",
                )
            )
            .orderBy("start")
            .limit(200)
        )
    assert block_stats is not None
    assert delay_stats is not None
    shown = {
        "events": totals["events"],
        "malformed lines": totals["malformed lines"],
        "queues with episodes": sum(1 for r in summary_rows if r["flow_stopped_count"] > 0),
        "flow episodes": totals["flow episodes"],
        "open episodes": totals["open episodes"],
        "channel blocks": int(block_stats["n"]),
        "store episodes": store_count,
    }
    if ignored:
        shown["other Broker-J lines (not analysed)"] = ignored
    data = ReportData(
        inputs=list(event_paths) + list(client_paths),
        window_start=_utc(window[0]),
        window_end=_utc(window[1]),
        totals=shown,
        summary=summary_rows[:50],
        timeline=timeline,
        timeline_buckets=_TIMELINE_BUCKETS,
        timeline_queues=[{"vhost": r["vhost"], "queue": r["queue"]} for r in top],
        block_histogram=tf.histogram_rows(block_stats.asDict(), "block"),
        delay_histogram=tf.histogram_rows(delay_stats.asDict(), "delay"),
        advice=advice_rows[:100],
        malformed=malformed_rows[:200],
        store_episodes=store_rows,
        send_delays=delay_rows[:20],
        open_now=open_now,
    )
    write_text_atomically(out / "report.html", render_report(data))
