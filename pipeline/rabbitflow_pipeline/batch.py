"""The batch job: every input read from the start, every table and ``report.html`` rewritten.

It runs the plan (:mod:`rabbitflow_pipeline.plan`) with its own pairing:
the whole input is paired in one job whose result (the intervals) is
kept on the executors; every table is computed from that or from small
aggregates of it, and the report's counts and histograms are observed
while the tables are written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline.checkpoint import write_text_atomically
from rabbitflow_pipeline.episodes import episode_timeline
from rabbitflow_pipeline.histograms import histogram_metrics, histogram_rows
from rabbitflow_pipeline.inputs import IGNORED, delay_seconds, is_malformed
from rabbitflow_pipeline.pairing import (
    KEY_COLLISIONS_METRIC,
    KeyHash,
    finish_intervals,
    pair_candidates,
    resolve_runs,
)
from rabbitflow_pipeline.plan import (
    AGGREGATE_STEPS,
    INTERVAL_STEPS,
    PARSE_CLIENT,
    PARSE_EVENTS,
    Output,
    Run,
)
from rabbitflow_pipeline.readers import read_events, read_lines
from rabbitflow_pipeline.report import ReportData, render_report
from rabbitflow_pipeline.schemas import QUEUE_LIMITS_SCHEMA
from rabbitflow_pipeline.session import is_connect

__all__ = ["TABLES", "AnalysisResult", "analyze"]

#: The Parquet tables written under ``--out``.
TABLES = (
    "episodes",
    "queue_summary",
    "channel_blocks",
    "store_episodes",
    "send_delays",
    "advice",
    "malformed",
)

#: Threads submitting the job's independent Spark jobs (see :func:`analyze`).
_JOB_THREADS = 4


@dataclass(frozen=True)
class AnalysisResult:
    """What one run produced: counts and where the outputs are."""

    out: Path
    events: int
    malformed: int
    episodes: int
    seconds: float
    phases: Mapping[str, float]
    #: Broker-J operational lines of codes the analysis does not use.
    ignored: int = 0
    #: Malformed event-log lines per reason, commonest first.
    malformed_reasons: Sequence[tuple[str, int]] = ()

    @property
    def all_malformed(self) -> bool:
        """Every non-blank event-log line was malformed (and there was at least one)."""
        return self.malformed > 0 and self.events == 0 and self.ignored == 0


def _observed(
    observation: Observation, key: str, df: DataFrame, metrics: Sequence[Column]
) -> dict[str, Any]:
    """The metrics ``observation`` saw, or, when they never arrived, ``df`` aggregated by them.

    Spark Connect does not report the metrics observed under a local
    checkpoint or a write; the aggregation then reads the (kept) rows again.
    """
    values = dict(observation.get)
    if key in values:
        return values
    row = df.agg(*metrics).first()
    return {} if row is None else row.asDict()


class _Metrics:
    """What the batch job observes while it runs: one observation per counted table."""

    def __init__(self) -> None:
        good_us = F.when(F.col("malformed_reason").isNull(), F.unix_micros("ts"))
        self.events = (
            Observation("events"),
            [
                F.count(F.lit(1)).alias("lines"),
                F.count(F.when(is_malformed(F.col("malformed_reason")), 1)).alias("malformed"),
                F.count(F.when(F.col("malformed_reason") == IGNORED, 1)).alias("ignored"),
                # The observed window spans the good events only.
                F.min(good_us).alias("window_start_us"),
                F.max(good_us).alias("window_end_us"),
            ],
        )
        self.delays = (Observation("send_delays"), histogram_metrics(delay_seconds(), "delay"))
        open_episodes = F.count(F.when(F.col("open"), F.lit(1))).alias("open")
        self.tables = {
            "episodes": (Observation("episodes"), [F.count(F.lit(1)).alias("n"), open_episodes]),
            "channel_blocks": (
                Observation("channel_blocks"),
                [F.count(F.lit(1)).alias("n"), *histogram_metrics(F.col("duration_s"), "block")],
            ),
            "store_episodes": (Observation("store_episodes"), [F.count(F.lit(1)).alias("n")]),
        }

    def seen(self, run: Run) -> dict[str, dict[str, Any]]:
        """The metrics observed of each table (``send_delays``: of the parsed client lines)."""
        seen = {
            name: _observed(observation, "n", run.table(name), metrics)
            for name, (observation, metrics) in self.tables.items()
        }
        delay_stats, delay_metrics = self.delays
        seen["send_delays"] = _observed(
            delay_stats, "delay_0", run.table("parsed_client"), delay_metrics
        )
        return seen


def _outputs(metrics: _Metrics) -> dict[str, Output]:
    """What the batch job does with each table of the plan that it does not only build."""
    written = Output(keep=True, write=True)
    return {
        **{name: Output(write=True, observe=seen) for name, seen in metrics.tables.items()},
        # One aggregation of the episodes serves the summary and the advice.
        "queue_stats": Output(keep=True),
        "send_delays": written,
        "malformed": written,
        "queue_summary": written,
        "advice": written,
    }


def _parse_and_pair(
    run: Run, metrics: _Metrics, key_hash: KeyHash, connect: bool
) -> dict[str, Any]:
    """Parse and pair the event records in one pass; gives ``intervals``, returns their counts.

    One pass over the input: parse, count and time-bound it on the fly
    (observe), pair every kind of event in one shuffle partitioned by the
    key hash alone, and keep only the paired intervals.
    """
    run.run((PARSE_EVENTS,), {})
    classified = run.table("events")
    stats, event_metrics = metrics.events
    # Spark Connect does not report what a local checkpoint observed:
    # there the pairing keeps the key columns in its partition spec.
    collisions = None if connect else Observation("keys")
    paired = run.keep(
        pair_candidates(
            classified.observe(stats, *event_metrics), collisions=collisions, key_hash=key_hash
        )
    )
    # The client logs do not depend on the pairing: read them alongside,
    # counting the delay histogram on the way.  (Observed under the
    # send_delays aggregation instead, the metrics of an empty client log
    # never arrive: adaptive execution replaces the plan over the empty
    # shuffle, observation and all.)
    run.run((PARSE_CLIENT,), {"parsed_client": Output(keep=True, observe=metrics.delays)})
    candidates = paired.result()
    counts = _observed(stats, "lines", classified, event_metrics)
    if collisions is not None and collisions.get[KEY_COLLISIONS_METRIC]:
        # Two keys share a hash (astronomically rare with 64 bits): pair
        # again with the key columns in the partition spec.
        candidates = run.keep(pair_candidates(classified, key_hash=key_hash)).result()
    # The intervals are the candidates plus the few resolved runs of
    # repeated opens: kept apart, so the candidates are not copied again.
    run.give("intervals", finish_intervals(candidates, run.keep(resolve_runs(candidates)).result()))
    return counts


def analyze(
    spark: SparkSession,
    event_paths: Sequence[str],
    out: Path,
    *,
    client_paths: Sequence[str] = (),
    queue_limits: Iterable[tuple[str, str, int | None, int | None]] | None = None,
    key_hash: KeyHash = F.xxhash64,
) -> AnalysisResult:
    """Read the logs, write every table under ``out`` and ``out/report.html``.

    The kept rows are dropped before it returns (or raises).  ``key_hash`` is
    the pairing's partition hash (:mod:`rabbitflow_pipeline.pairing`; tests
    pass one that collides).

    Raises:
        pyspark.errors.AnalysisException: an input path matches no file.
    """
    phases, metrics = outputs.Phases(), _Metrics()
    out.mkdir(parents=True, exist_ok=True)
    # Independent Spark jobs are submitted from a few threads: Spark runs
    # them one after the other in submission order (FIFO), and a later job
    # takes the cores an earlier one leaves idle (its last tasks, the
    # driver's planning between jobs).  Each table is computed exactly as
    # it would be in sequence; only the scheduling overlaps.
    kept = outputs.Kept()
    try:
        with ThreadPoolExecutor(max_workers=_JOB_THREADS, thread_name_prefix="analyze") as pool:
            # Both inputs are resolved first, so a path that matches nothing
            # fails before any job starts.
            inputs = {
                "event_records": read_events(spark, event_paths),
                "client_lines": read_lines(spark, client_paths),
                "queue_limits": None
                if queue_limits is None
                else spark.createDataFrame(list(queue_limits), QUEUE_LIMITS_SCHEMA),
            }
            run = Run(pool, kept, out, inputs)
            counts = _parse_and_pair(run, metrics, key_hash, is_connect(spark))
            phases.passed("parse+pair")
            window_us = (counts["window_start_us"], counts["window_end_us"])
            run.give("window", outputs.window_frame(spark, *window_us))
            run.run((*INTERVAL_STEPS, *AGGREGATE_STEPS), _outputs(metrics))
            run.finish()
            phases.passed("tables")
            rows = _report_rows(run, pool)
            seen = metrics.seen(run)
    finally:
        # Everything the report needs is collected: drop the kept rows now
        # rather than when the JVM gets round to it.
        kept.release()
    return _report(
        out,
        counts,
        rows,
        seen=seen,
        window_us=window_us,
        inputs=[*event_paths, *client_paths],
        phases=phases,
    )


def _report_rows(run: Run, pool: ThreadPoolExecutor) -> dict[str, list[dict[str, Any]]]:
    """What ``report.html`` shows of the tables, collected."""
    summary, malformed = run.table("queue_summary"), run.table("malformed")
    by_overfull = summary.orderBy(F.desc("time_overfull_s"), "vhost", "queue")
    top = by_overfull.limit(outputs.TIMELINE_QUEUES)
    queries = {
        "summary": by_overfull.limit(50),
        "timeline": episode_timeline(
            run.table("episodes"), run.table("window"), top, outputs.TIMELINE_BUCKETS
        ),
        "timeline_queues": top.select("vhost", "queue"),
        "advice": run.table("advice")
        .orderBy(F.coalesce(F.col("stop_ok"), F.lit(True)), F.desc("episodes"))
        .limit(100),
        "malformed": malformed.orderBy(F.desc("count")).limit(200),
        "malformed_reasons": malformed.where(F.col("log") == "gateway")
        .groupBy("reason")
        .agg(F.sum("count").alias("count"))
        .orderBy(F.desc("count"), "reason"),
        "store_episodes": run.table("store_episodes").orderBy("start").limit(50),
        "send_delays": run.table("send_delays")
        .orderBy(F.desc_nulls_last("longest_delay_ms"))
        .limit(20),
        "queues_with_episodes": summary.where(F.col("flow_stopped_count") > 0).select(
            F.count(F.lit(1)).alias("n")
        ),
    }
    return dict(zip(queries, pool.map(outputs.rows, queries.values()), strict=True))


def _report(
    out: Path,
    counts: Mapping[str, Any],
    rows: Mapping[str, list[dict[str, Any]]],
    *,
    seen: Mapping[str, Mapping[str, Any]],
    window_us: tuple[int | None, int | None],
    inputs: list[str],
    phases: outputs.Phases,
) -> AnalysisResult:
    """Write ``report.html`` from the collected rows and counts; the run's result."""
    totals = {
        "events": int(counts["lines"]) - int(counts["malformed"]) - int(counts["ignored"]),
        "malformed lines": int(counts["malformed"]),
        "queues with episodes": int(rows["queues_with_episodes"][0]["n"]),
        "flow episodes": int(seen["episodes"]["n"]),
        "open episodes": int(seen["episodes"]["open"]),
        "channel blocks": int(seen["channel_blocks"]["n"]),
        "store episodes": int(seen["store_episodes"]["n"]),
    }
    ignored = int(counts["ignored"])
    if ignored:
        totals["other Broker-J lines (not analysed)"] = ignored
    data = ReportData(
        inputs=inputs,
        window_start=outputs.utc(window_us[0]),
        window_end=outputs.utc(window_us[1]),
        totals=totals,
        summary=rows["summary"],
        timeline=rows["timeline"],
        timeline_buckets=outputs.TIMELINE_BUCKETS,
        timeline_queues=rows["timeline_queues"],
        block_histogram=histogram_rows(seen["channel_blocks"], "block"),
        delay_histogram=histogram_rows(seen["send_delays"], "delay"),
        advice=rows["advice"],
        malformed=rows["malformed"],
        store_episodes=rows["store_episodes"],
        send_delays=rows["send_delays"],
    )
    write_text_atomically(out / "report.html", render_report(data))
    phases.passed("report")
    return AnalysisResult(
        out=out,
        events=totals["events"],
        malformed=totals["malformed lines"],
        ignored=ignored,
        malformed_reasons=tuple((r["reason"], int(r["count"])) for r in rows["malformed_reasons"]),
        episodes=totals["flow episodes"],
        seconds=time.monotonic() - phases.started,
        phases=phases.seconds,
    )
