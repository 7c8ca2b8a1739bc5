"""Incremental and live analysis: ``rabbitflow-analyze --incremental`` and ``--follow``.

Each step reads only what was added to the inputs since the last committed
step (new files, lines appended to files already read: see
:mod:`rabbitflow_pipeline.offsets`), parses it exactly as the batch job
does, pairs it with the stored state of the intervals still open, and
updates the tables and ``report.html``.  The final tables equal what the
batch job writes for the whole input.  What is kept where is described in
:mod:`rabbitflow_pipeline.checkpoint`.

**Settling.**  Events may arrive up to ``lateness`` late; see
:mod:`rabbitflow_pipeline.settling`.

**Aggregates.**  Nothing is re-read from earlier steps but the episodes of
the queues the report's timeline draws: the per-queue statistics are a
running state (:mod:`~rabbitflow_pipeline.stats_state`), the send delays
and malformed counts merged into the stored tables, blocked channels
stored per channel with their settled block counts, and the report's
histograms and totals counters in the checkpoint.

**Commit.**  A step writes everything under names of its own step number
and then replaces ``commit.json`` (the one commit point); whatever a
killed step left that the checkpoint does not name is deleted by the
next step, which starts the killed step again from its staged copy.
Nothing is read twice and nothing is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline.checkpoint import (
    STATE_DIR,
    Checkpoint,
    clean,
    commit,
    exclusive,
    load_checkpoint,
    load_manifest,
    stage,
    write_text_atomically,
)
from rabbitflow_pipeline.delays import merge_send_delays
from rabbitflow_pipeline.histograms import DEFAULT_HISTOGRAM_EDGES_S, histogram_rows
from rabbitflow_pipeline.malformed import malformed_reasons, malformed_summary
from rabbitflow_pipeline.offsets import Tracked
from rabbitflow_pipeline.plan import (
    AGGREGATE_STEPS,
    BLOCKED_CHANNELS,
    CHANNEL_BLOCKS,
    CLIENT_RECORDS,
    INTERVAL_STEPS,
    SEND_DELAYS,
    Run,
)
from rabbitflow_pipeline.report import ReportData, render_report
from rabbitflow_pipeline.schemas import (
    EPISODES_SCHEMA,
    QUEUE_LIMITS_SCHEMA,
    STORE_EPISODES_SCHEMA,
)
from rabbitflow_pipeline.session import is_connect
from rabbitflow_pipeline.settling import (
    SMALL_TABLES,
    StepState,
    compact,
    empty_client,
    fetch_small,
    final_rows,
    higher,
    lower,
    pair_step,
    parse_step,
    provisional_rows,
    read_table,
    value_frame,
)
from rabbitflow_pipeline.stats_state import running_queue_stats

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

#: Threads submitting a step's independent Spark jobs (as the batch job does).
_JOB_THREADS = 4

_CHANNELS_SCHEMA = (
    "vhost string, queue string, source string, connection long, channel long, blocks long"
)
_MALFORMED_SCHEMA = "log string, source string, reason string, count long"


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


def _aggregates(step: StepState, queue_limits: Any) -> None:
    """Summary, advice, send delays and malformed counts from the stored state and this step.

    The plan's aggregates over what is kept across steps: the per-queue
    statistics and blocked channels stored with this step's, the send delays
    and malformed counts merged with the stored ones."""
    spark = step.spark
    assert step.tables is not None
    limits = None
    if queue_limits is not None:
        limits = spark.createDataFrame(list(queue_limits), QUEUE_LIMITS_SCHEMA)
    client = step.client if step.client is not None else empty_client(spark)
    step.window = _window_frame(step)
    given = {"window": step.window, "parsed_client": client, "queue_limits": limits}
    run = Run(step.pool, step.kept, None, given)
    # From the stored statistics and this step's episodes (not the table).
    run.give("queue_stats", step.pool.submit(running_queue_stats, step, _window(step)[1]))
    # A table whose inputs brought nothing new stays as stored (no job
    # merges it, nothing is written): the send delays without new client
    # lines, the malformed counts without new malformed or client lines.
    unchanged = {
        "send_delays": step.client is None and bool(step.cp.tables.get("send_delays")),
        "malformed": _no_new_malformed(step) and bool(step.cp.tables.get("malformed")),
    }
    if unchanged["send_delays"]:
        run.give("send_delays", _previous(step, "send_delays", _new_delays(client).schema))
    else:
        run.give("send_delays", run.keep(_merged_delays(step, client)))
    if unchanged["malformed"]:
        run.give("malformed", _previous(step, "malformed", _MALFORMED_SCHEMA))
    else:
        run.give("malformed", _merged_malformed(step, client))
    step.channels = f"channels/v{step.batch:08d}"
    run.give("blocked_channels", step.pool.submit(_store_channels, step))
    # The small tables are each fetched once, in one job, written from the
    # driver and shown from the same rows.
    run.run(AGGREGATE_STEPS, {})
    fetched = {
        table: step.pool.submit(fetch_small, step, run.table(table), table)
        for table in SMALL_TABLES
        if not unchanged.get(table, False)
    }
    step.small = {}
    for table in SMALL_TABLES:
        if table in fetched:
            step.tables[table], step.small[table] = fetched[table].result()
        else:
            step.tables[table] = step.cp.tables[table]
            files = [step.out / table / name for name in step.cp.tables[table]]
            step.small[table] = outputs.arrow_rows(outputs.read_arrow(files))


def _no_new_malformed(step: StepState) -> bool:
    """No new malformed event line and no new client line (malformed or not)."""
    assert step.counts is not None
    return step.client is None and not int(step.counts["malformed"])


def _merged_delays(step: StepState, client: DataFrame) -> DataFrame:
    """The ``send_delays`` table: the stored one merged with this step's client records."""
    new = _new_delays(client)
    return merge_send_delays(_previous(step, "send_delays", new.schema).unionByName(new))


def _new_delays(client: DataFrame) -> DataFrame:
    """This step's send delays (of its client records)."""
    return SEND_DELAYS({"client_records": CLIENT_RECORDS({"parsed_client": client})})


def _merged_malformed(step: StepState, client: DataFrame) -> DataFrame:
    """The ``malformed`` table: the stored counts plus this step's."""
    assert step.intervals is not None
    gateway_malformed = (
        step.intervals.where(F.col("kind") == "malformed")
        .groupBy("source", "reason")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(F.lit("gateway").alias("log"), "source", "reason", "count")
    )
    client_malformed = malformed_summary(
        step.spark.createDataFrame([], "source string, malformed_reason string"), client
    )
    return (
        _previous(step, "malformed", _MALFORMED_SCHEMA)
        .unionByName(gateway_malformed)
        .unionByName(client_malformed)
        .groupBy("log", "source", "reason")
        .agg(F.sum("count").alias("count"))
    )


def _blocked_channels(intervals: DataFrame) -> DataFrame:
    return BLOCKED_CHANNELS({"channel_blocks": CHANNEL_BLOCKS({"intervals": intervals})})


def _store_channels(step: StepState) -> DataFrame:
    """Store the blocked channels with this step's settled blocks; returns them with the
    provisional ones (the ``blocked_channels`` the summary reads)."""
    assert step.channels is not None
    channels = _stored_channels(step).unionByName(_blocked_channels(final_rows(step)))
    outputs.write_table(
        channels.groupBy("vhost", "queue", "source", "connection", "channel").agg(
            F.sum("blocks").alias("blocks")
        ),
        step.root / step.channels,
    )
    provisional = _blocked_channels(provisional_rows(step))
    stored = step.spark.read.schema(_CHANNELS_SCHEMA).parquet(str(step.root / step.channels))
    return stored.unionByName(provisional)


def _stored_channels(step: StepState) -> DataFrame:
    if step.cp.channels is None:
        return step.spark.createDataFrame([], _CHANNELS_SCHEMA)
    return step.spark.read.schema(_CHANNELS_SCHEMA).parquet(str(step.root / step.cp.channels))


def _previous(step: StepState, table: str, schema: Any) -> DataFrame:
    files = step.cp.tables.get(table, ())
    if not files:
        return step.spark.createDataFrame([], schema)
    return step.spark.read.schema(schema).parquet(*(str(step.out / table / f) for f in files))


def _window_frame(step: StepState) -> DataFrame:
    """The observed window after this step, as the aggregates read it (from a file:
    see :func:`~rabbitflow_pipeline.settling.value_frame`)."""
    start_us, end_us = _window(step)
    return outputs.window_of(value_frame(step, "window", {"start_us": start_us, "end_us": end_us}))


def _window(step: StepState) -> tuple[int | None, int | None]:
    assert step.counts is not None
    return (
        lower(step.cp.window_start_us, step.counts["start_us"]),
        higher(step.cp.window_end_us, step.counts["end_us"]),
    )


def _counters(step: StepState) -> dict[str, int]:
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
    edges = len(DEFAULT_HISTOGRAM_EDGES_S)
    return {
        f"{name}_{i}": int(counters.get(f"{name}_{i}", 0)) + int(extra.get(f"prov_{name}_{i}", 0))
        for i in range(edges)
    }


def _shown_totals(
    totals: Mapping[str, int],
    counters: Mapping[str, int],
    extra: Mapping[str, Any],
    summary_rows: Sequence[Mapping[str, Any]],
    ignored: int,
) -> dict[str, int]:
    """The report's totals: the checkpoint's settled counts plus this step's provisional ones."""
    shown = {
        "events": totals["events"],
        "malformed lines": totals["malformed lines"],
        "queues with episodes": sum(1 for r in summary_rows if r["flow_stopped_count"] > 0),
        "flow episodes": totals["flow episodes"],
        "open episodes": totals["open episodes"],
        "channel blocks": counters.get("channel_blocks", 0) + int(extra["prov_channel_blocks"]),
        "store episodes": counters.get("store_episodes", 0) + int(extra["prov_store_episodes"]),
    }
    if ignored:
        shown["other Broker-J lines (not analysed)"] = ignored
    return shown


def _report(
    step: StepState, counters: Mapping[str, int], totals: Mapping[str, int], **kw: Any
) -> list[dict[str, Any]]:
    """Collect the report's rows (small tables, counters) and replace ``report.html``.

    Returns the ``malformed`` table's rows (the step's result names its reasons).
    """
    assert step.small is not None
    assert step.window is not None
    assert step.step_counts is not None
    spark, extra = step.spark, step.step_counts
    small = step.small
    stores = read_table(step, "store_episodes", STORE_EPISODES_SCHEMA)
    store_rows = step.pool.submit(outputs.rows, stores.orderBy("start").limit(50))
    open_now = None
    if kw["live"]:
        provisional = provisional_rows(step)
        open_now = step.pool.submit(
            outputs.rows,
            outputs.open_now(*(each({"intervals": provisional}) for each in INTERVAL_STEPS)),
        )
    summary_rows = sorted(
        small["queue_summary"],
        key=lambda r: (-(r["time_overfull_s"] or 0.0), r["vhost"], r["queue"]),
    )
    top = summary_rows[: outputs.TIMELINE_QUEUES]
    window = _window(step)
    episodes = read_table(step, "episodes", EPISODES_SCHEMA)
    timeline = outputs.timeline_rows(spark, episodes, step.window, top)
    blocks = _histogram(counters, extra, "block")
    delays = {f"delay_{i}": counters.get(f"delay_{i}", 0) for i in range(len(blocks))}
    shown = _shown_totals(totals, counters, extra, summary_rows, kw["ignored"])
    data = ReportData(
        inputs=[*kw["event_paths"], *kw["client_paths"]],
        window_start=outputs.utc(window[0]),
        window_end=outputs.utc(window[1]),
        totals=shown,
        summary=summary_rows[:50],
        timeline=timeline,
        timeline_buckets=outputs.TIMELINE_BUCKETS,
        timeline_queues=[{"vhost": r["vhost"], "queue": r["queue"]} for r in top],
        block_histogram=histogram_rows(blocks, "block"),
        delay_histogram=histogram_rows(delays, "delay"),
        advice=sorted(
            small["advice"],
            key=lambda r: (r["stop_ok"] is not False, -(r["episodes"] or 0)),
        )[:100],
        malformed=sorted(small["malformed"], key=lambda r: -int(r["count"]))[:200],
        store_episodes=store_rows.result(),
        send_delays=sorted(
            small["send_delays"],
            key=lambda r: (r["longest_delay_ms"] is None, -(r["longest_delay_ms"] or 0)),
        )[:20],
        open_now=None if open_now is None else open_now.result(),
    )
    write_text_atomically(step.out / "report.html", render_report(data))
    return small["malformed"]


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
    (``--follow``).  ``hook`` is called with the name of each stage (``staged``,
    ``parsed``, ``paired``, ``tables``, ``report``, ``committed``) as the step
    passes it; a test raises from it to kill the step there.  Steps on one ``out`` take turns.

    Raises:
        ValueError: ``lateness_s`` is negative.
        FileNotFoundError: a non-glob input names nothing, before any step read one.
    """
    if lateness_s < 0:
        raise ValueError(f"lateness must not be negative, got {lateness_s}")
    with exclusive(out):
        phases = outputs.Phases(hook)
        cp, manifest = _staged(out, event_paths, client_paths)
        parts = manifest["parts"]
        if not parts and cp.batch >= 0:
            # Nothing new: the tables, state and report stay exactly as they are.
            return _unchanged(out, cp, phases.started)
        phases.passed("staged")
        kept = outputs.Kept()
        session = _step_session(spark)
        try:
            with ThreadPoolExecutor(_JOB_THREADS, thread_name_prefix="step") as pool:
                step = StepState(session, out, cp, parts, int(lateness_s * 1_000_000), kept, pool)
                parse_step(step)
                phases.passed("parsed")
                pair_step(step)
                phases.passed("paired")
                _aggregates(step, queue_limits)
                phases.passed("tables")
                checkpoint = _next_checkpoint(step, manifest)
                malformed = _report(
                    step,
                    checkpoint.counters,
                    _totals(step, checkpoint),
                    event_paths=event_paths,
                    client_paths=client_paths,
                    ignored=checkpoint.ignored,
                    live=live,
                )
                phases.passed("report")
                reasons = malformed_reasons(malformed)
        finally:
            kept.release()
        checkpoint = _committed(spark, out, checkpoint, phases)
        return _result(step, checkpoint, phases, reasons)


def _committed(
    spark: SparkSession, out: Path, checkpoint: Checkpoint, phases: outputs.Phases
) -> Checkpoint:
    """Commit the step (compacted first, when due); delete what it replaced."""
    checkpoint = compact(spark, out, checkpoint)
    commit(out, checkpoint)
    phases.passed("committed")
    clean(out, checkpoint, keep_staging=None)
    return checkpoint


def _staged(
    out: Path, event_paths: Sequence[str], client_paths: Sequence[str]
) -> tuple[Checkpoint, Mapping[str, Any]]:
    """The last checkpoint and this step's manifest: staged now, or by a killed step
    (``out``'s state directory exists: the step's lock is in it)."""
    cp = load_checkpoint(out)
    manifest = load_manifest(out, cp.batch + 1)
    clean(out, cp, keep_staging=cp.batch + 1 if manifest is not None else None)
    if manifest is None:
        patterns = [("events", p) for p in event_paths] + [("client", p) for p in client_paths]
        manifest = stage(out, cp, patterns)
    return cp, manifest


def _result(
    step: StepState,
    checkpoint: Checkpoint,
    phases: outputs.Phases,
    reasons: tuple[tuple[str, int], ...],
) -> StepResult:
    totals = _totals(step, checkpoint)
    return StepResult(
        out=step.out,
        batch=checkpoint.batch,
        changed=True,
        new_bytes=sum(int(p["end"]) - int(p["start"]) for p in step.parts),
        events=totals["events"],
        malformed=checkpoint.malformed,
        ignored=checkpoint.ignored,
        late=checkpoint.late,
        episodes=totals["flow episodes"],
        open_episodes=totals["open episodes"],
        seconds=time.monotonic() - phases.started,
        phases=phases.seconds,
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
    if is_connect(spark):
        return spark
    session = spark.newSession()
    session.conf.set("spark.sql.adaptive.enabled", "false")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    return session


def _next_checkpoint(step: StepState, manifest: Mapping[str, Any]) -> Checkpoint:
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
        stats=step.stats,
        tables=dict(step.tables),
        counters=_counters(step),
    )


def _totals(step: StepState, checkpoint: Checkpoint) -> dict[str, int]:
    assert step.step_counts is not None
    return {
        "events": checkpoint.lines - checkpoint.malformed - checkpoint.ignored,
        "malformed lines": checkpoint.malformed,
        "flow episodes": checkpoint.counters.get("episodes", 0)
        + int(step.step_counts["prov_episodes"]),
        "open episodes": int(step.step_counts["open_episodes"]),
    }


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
