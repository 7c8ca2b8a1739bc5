"""``rabbitflow-analyze``: the Spark job entry point (all the pipeline's I/O is here).

    rabbitflow-analyze EVENT_LOG... --out DIR [--client-log PATH...]
                       [--queue-limits FILE.json] [--master URL | --remote URL]
                       [--incremental | --follow [--trigger SECONDS]]

Local mode (``local[2]``) unless ``--master`` is given or the job runs
under ``spark-submit`` (which supplies the master); see docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline import transforms as tf
from rabbitflow_pipeline.incremental import (
    DEFAULT_LATENESS_S,
    StepResult,
    follow,
    run_step,
    write_text_atomically,
)
from rabbitflow_pipeline.report import ReportData, render_report
from rabbitflow_pipeline.schemas import (
    CORRUPT_COLUMN,
    EVENT_WIRE_SCHEMA,
    LINES_SCHEMA,
    QUEUE_LIMITS_SCHEMA,
)

__all__ = [
    "DEFAULT_FLOW_STOP_THRESHOLD",
    "SPARK_CONF",
    "TABLES",
    "AnalysisResult",
    "QueueLimitsError",
    "analyze",
    "build_session",
    "main",
    "parse_queue_limits",
    "read_events",
    "read_lines",
]

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

#: Session settings the transforms need.  Constraint propagation infers
#: filters from every aliased CASE expression of the malformed-line checks
#: and grows exponentially with them (planning took minutes and ran out of
#: heap); the transforms gain nothing from it.
SPARK_CONF = {
    "spark.sql.constraintPropagation.enabled": "false",
    # The per-queue exact percentiles keep each queue's values in one
    # buffer; past 128 groups per task Spark would sort the episodes
    # instead of hashing them (measured: about twice as slow at 300 queues).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
    # Timestamps as Parquet's int64 TIMESTAMP_MICROS instead of Spark's
    # legacy INT96 default (deprecated in Parquet): the interval tables
    # write about 30% faster (measured on the benchmark logs).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Spark keeps 100 compiled classes of generated code per JVM; one run of
    # the analysis generates about 150, so each run evicted the last one's
    # and compiled (and JIT-compiled) them all again.  With this, a second
    # run in the same Spark application reuses them all (1 log, warm:
    # 13.4-14.0 s -> 9.1-9.9 s); Spark keys them by the application's class
    # loader, so a new application compiles its own.  A static setting: it
    # takes effect in a JVM whose first session sets it.
    "spark.sql.codegen.cache.maxEntries": "1000",
}

#: Columns whose values are nearly all distinct (times and durations): a
#: Parquet dictionary for them is built, outgrows its page and is dropped,
#: so the writer is told not to try.
_UNIQUE_COLUMNS = ("start", "end", "duration_s", "first_seen", "last_seen")

_EPOCH = dt.datetime(1970, 1, 1)
TIMELINE_BUCKETS = 240
TIMELINE_QUEUES = 30
#: Threads submitting the job's independent Spark jobs (see :func:`analyze`).
_JOB_THREADS = 4


class QueueLimitsError(ValueError):
    """The ``--queue-limits`` file is not a list of queues with maxima."""


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


def build_session(
    master: str | None = None, app_name: str = "rabbitflow-analyze", *, remote: str | None = None
) -> SparkSession:
    """The Spark session: ``master`` if given, the spark-submit master, else ``local[2]``.

    With ``remote`` (``sc://HOST:PORT``) a Spark Connect session instead:
    the server's own settings apply, plus the session time zone.
    Session time zone is UTC so every timestamp is read and written in UTC.
    """
    if remote is not None:
        connect = SparkSession.builder.remote(remote).getOrCreate()
        connect.conf.set("spark.sql.session.timeZone", "UTC")
        for key, value in SPARK_CONF.items():
            if key != "spark.sql.codegen.cache.maxEntries":
                connect.conf.set(key, value)
        return connect
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    # spark-submit starts the Py4J gateway itself and hands its port to Python.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not under_submit:
        master = "local[2]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Local Python workers must run this interpreter (the one that has
        # rabbitflow installed), not whatever python3 is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Local mode runs the executor inside the driver JVM: its default 1 GiB
        # heap makes the pairing sort spill at a few million events.
        builder = (
            builder.config("spark.sql.shuffle.partitions", "8")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", os.environ.get("RABBITFLOW_DRIVER_MEMORY", "4g"))
            # The pairing window buffers each key's events; past this many rows
            # Spark moves the buffer into slower spillable pages.  A hot queue
            # or channel has ~10^5 events in 5 M; 2^20 rows of ~250 bytes fit
            # the 4 GiB heap.
            .config("spark.sql.windowExec.buffer.in.memory.threshold", str(1 << 20))
        )
    spark = builder.getOrCreate()
    # Spark logs a stack trace at WARN for every input glob it resolves; keep the console useful.
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Lines of text files (globs allowed) with the file each came from (``source``)."""
    if not paths:
        return spark.createDataFrame([], LINES_SCHEMA)
    return spark.read.text(list(paths)).select("value", F.input_file_name().alias("source"))


def read_events(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Raw gateway event records (``EVENT_WIRE_SCHEMA`` + ``source``) of files or globs.

    Spark's JSON source with the explicit schema: no inference pass, a line
    that is not JSON lands in the corrupt-record column, blank lines are
    skipped.  ``source`` is ``input_file_name()`` (``file:///dir/gw.jsonl``):
    the ``_metadata.file_path`` column (``file:/dir/gw.jsonl``) costs about
    a third more per parsed line (measured on the benchmark logs).
    """
    return (
        spark.read.schema(EVENT_WIRE_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(list(paths))
        .select("*", F.input_file_name().alias("source"))
    )


def _first_int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value > 0:
            return value
    return None


#: The gateway's ``--default-flow-stop-threshold`` default (percent of a queue's maximum).
DEFAULT_FLOW_STOP_THRESHOLD = 80


def _derived_maximum(stop: Any, stop_pct: int) -> int | None:
    """The smallest maximum whose ``stop_pct`` percent is the default stop threshold ``stop``.

    The gateway sets a default stop at ``maximum * pct // 100``, so the
    maximum is at least ``ceil(stop * 100 / pct)``; the smallest is taken,
    which makes the advice's "stop + capacities fit the maximum" check no
    more lenient than with the real maximum.
    """
    value = _first_int(stop)
    if value is None:
        return None
    return -(-value * 100 // stop_pct)


def _gateway_limits(item: Mapping[str, Any], stop_pct: int) -> tuple[int | None, int | None]:
    """A gateway admin API queue's maxima: shown ones, else derived from default thresholds."""
    max_count = _first_int(item.get("maxCount"))
    max_size = _first_int(item.get("maxSize"))
    if item.get("source") == "default":
        # The gateway derived these thresholds from the queue's maximum.
        if max_count is None:
            max_count = _derived_maximum(item.get("flowStopCount"), stop_pct)
        if max_size is None:
            max_size = _derived_maximum(item.get("flowStopSize"), stop_pct)
    return max_count, max_size


def _lowest(*values: Any) -> int | None:
    present = [v for v in (_first_int(value) for value in values) if v is not None]
    return min(present) if present else None


def parse_queue_limits(
    document: Any, *, default_stop_pct: int = DEFAULT_FLOW_STOP_THRESHOLD
) -> list[tuple[str, str, int | None, int | None]]:
    """Queue maxima from a ``--queue-limits`` document.

    Accepts a JSON list of queue objects (or ``{"queues": [...]}``) in any
    of three forms:

    * our own ``{"vhost", "queue", "max_count", "max_size"}``;
    * a gateway admin API ``GET /api/queues`` snapshot (recognised by its
      ``flowStopCount``): ``maxCount``/``maxSize`` when shown, else, for a
      queue whose thresholds are the gateway's defaults (``"source":
      "default"``), the maximum those defaults were derived from at
      ``default_stop_pct`` percent (the gateway's
      ``--default-flow-stop-threshold``); a queue with thresholds of its own
      shows no maximum and gets nulls;
    * a RabbitMQ management ``/api/queues`` snapshot: the lowest of
      ``arguments`` ``x-max-length`` (``x-max-length-bytes``), Qpid's
      ``qpid.max_count`` (``qpid.max_size``) and the
      ``effective_policy_definition`` ``max-length`` (``max-length-bytes``).

    Queues with neither maximum are kept with nulls.

    Raises:
        QueueLimitsError: not a list of objects, an object without a name, or
            ``default_stop_pct`` not in 1..100.
    """
    if not 0 < default_stop_pct <= 100:
        raise QueueLimitsError(
            f"default flow stop threshold must be 1..100 percent, got {default_stop_pct}"
        )
    if isinstance(document, Mapping) and "queues" in document:
        document = document["queues"]
    if not isinstance(document, list):
        raise QueueLimitsError("queue limits must be a JSON list of queue objects")
    rows: list[tuple[str, str, int | None, int | None]] = []
    for index, item in enumerate(document):
        if not isinstance(item, Mapping):
            raise QueueLimitsError(f"queue limits entry {index} is not an object")
        name = item.get("queue", item.get("name"))
        if not isinstance(name, str) or not name:
            raise QueueLimitsError(f"queue limits entry {index} has no queue name")
        vhost = item.get("vhost") or "/"
        if "flowStopCount" in item:
            max_count, max_size = _gateway_limits(item, default_stop_pct)
            rows.append((str(vhost), name, max_count, max_size))
            continue
        args = item.get("arguments") or {}
        policy = item.get("effective_policy_definition") or {}
        max_count = _first_int(item.get("max_count"), item.get("max_length")) or _lowest(
            item.get("x-max-length"),
            args.get("x-max-length"),
            args.get("qpid.max_count"),
            policy.get("max-length"),
        )
        max_size = _first_int(item.get("max_size"), item.get("max_length_bytes")) or _lowest(
            item.get("x-max-length-bytes"),
            args.get("x-max-length-bytes"),
            args.get("qpid.max_size"),
            policy.get("max-length-bytes"),
        )
        rows.append((str(vhost), name, max_count, max_size))
    return rows


def _is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (``--remote``) rather than one with a JVM in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _observed(
    observation: Observation, key: str, df: DataFrame, metrics: Sequence[Any]
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


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def _write(df: DataFrame, out: Path, name: str) -> None:
    plain = {f"parquet.enable.dictionary#{c}": "false" for c in _UNIQUE_COLUMNS if c in df.columns}
    df.write.mode("overwrite").options(**plain).parquet(str(out / name))


def _window_frame(spark: SparkSession, start_us: int | None, end_us: int | None) -> DataFrame:
    """The one-row observed window from its bounds in microseconds.

    Columns ``window_start``, ``window_end`` (timestamps) and ``window_s``.

    Built from literals, not ``createDataFrame``: a DataFrame of Python rows
    starts a Python worker to read them back (about 2 s in local mode).
    """
    start = F.lit(start_us).cast("long")
    end = F.lit(end_us).cast("long")
    return spark.range(1).select(
        F.timestamp_micros(start).alias("window_start"),
        F.timestamp_micros(end).alias("window_end"),
        ((end - start) / F.lit(1_000_000.0)).alias("window_s"),
    )


def _utc(micros: int | None) -> dt.datetime | None:
    """A naive UTC datetime from microseconds since the epoch (the report's times)."""
    return None if micros is None else _EPOCH + dt.timedelta(microseconds=micros)


class _Kept:
    """The rows :func:`analyze` keeps on the executors while it runs, released at its end.

    Rows are kept as local checkpoints: cheaper than ``cache()`` for rows
    read a few times in full (no columnar encoding), and the lineage is cut
    so later jobs start from the rows.  Spark would hold the blocks until
    the JVM collects the checkpointed data, so a long-lived session calling
    :func:`analyze` again would carry them into its next jobs:
    :meth:`release` drops them as soon as the run is over.
    """

    def __init__(self) -> None:
        self._frames: list[DataFrame] = []
        self._lock = threading.Lock()

    def keep(self, df: DataFrame) -> DataFrame:
        """Compute ``df`` once and keep its rows; returns a DataFrame over them."""
        kept = df.localCheckpoint(eager=True)
        with self._lock:
            self._frames.append(kept)
        return kept

    def keep_and_write(self, df: DataFrame, out: Path, name: str) -> DataFrame:
        """:meth:`keep` ``df``, then write it as table ``name``; returns the kept rows."""
        kept = self.keep(df)
        _write(kept, out, name)
        return kept

    def release(self) -> None:
        """Drop every kept row (DataFrames returned by :meth:`keep` are unusable after)."""
        with self._lock:
            frames, self._frames = self._frames, []
        for kept in frames:
            if not hasattr(kept, "_jdf"):
                # Spark Connect: the server drops a session's checkpoints with the session.
                continue
            # A local checkpoint's plan is the checkpointed RDD itself (LogicalRDD).
            plan = kept._jdf.queryExecution().analyzed()
            if plan.getClass().getSimpleName() == "LogicalRDD":
                # Blocking: the removal finishes here, not in a pool that a
                # session stopped right after the run would already have shut.
                plan.rdd().unpersist(True)


def analyze(
    spark: SparkSession,
    event_paths: Sequence[str],
    out: Path,
    *,
    client_paths: Sequence[str] = (),
    queue_limits: Iterable[tuple[str, str, int | None, int | None]] | None = None,
    key_hash: tf.KeyHash = F.xxhash64,
) -> AnalysisResult:
    """Read the logs, write every table under ``out`` and ``out/report.html``.

    The event log is parsed and paired in one job whose result (the paired
    intervals) is kept on the executors; every table is computed from that
    or from small aggregates of it, and the report's counts and histograms
    are observed while the tables are written.  The kept rows are dropped
    before it returns (or raises).  ``key_hash`` is the pairing's
    partition hash (:func:`rabbitflow_pipeline.transforms.flow_intervals`;
    tests pass one that collides).

    Raises:
        pyspark.errors.AnalysisException: an input path matches no file.
    """
    started = time.monotonic()
    phases: dict[str, float] = {}
    mark = started

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = now - mark
        mark = now

    out.mkdir(parents=True, exist_ok=True)
    # Independent Spark jobs are submitted from a few threads: Spark runs
    # them one after the other in submission order (FIFO), and a later job
    # takes the cores an earlier one leaves idle (its last tasks, the
    # driver's planning between jobs).  Each table is computed exactly as
    # it would be in sequence; only the scheduling overlaps.
    kept = _Kept()
    try:
        with ThreadPoolExecutor(max_workers=_JOB_THREADS, thread_name_prefix="analyze") as pool:
            # One pass over the input: parse, count and time-bound it on the
            # fly (observe), pair every kind of event in one shuffle partitioned
            # by the key hash alone, and keep only the paired intervals.
            stats = Observation("events")
            # Both inputs are resolved first, so a path that matches nothing
            # fails before any job starts.
            classified = tf.classify_events(read_events(spark, event_paths))
            client_lines = read_lines(spark, client_paths)
            # The observed window spans the good events only.
            good_us = F.when(F.col("malformed_reason").isNull(), F.unix_micros("ts"))
            event_metrics = [
                F.count(F.lit(1)).alias("lines"),
                F.count(F.when(tf.is_malformed(F.col("malformed_reason")), 1)).alias("malformed"),
                F.count(F.when(F.col("malformed_reason") == tf.IGNORED, 1)).alias("ignored"),
                F.min(good_us).alias("window_start_us"),
                F.max(good_us).alias("window_end_us"),
            ]
            parsed = classified.observe(stats, *event_metrics)
            # Spark Connect does not report what a local checkpoint observed:
            # there the pairing keeps the key columns in its partition spec.
            collisions = None if _is_connect(spark) else Observation("keys")
            paired = pool.submit(
                kept.keep, tf.pair_candidates(parsed, collisions=collisions, key_hash=key_hash)
            )
            # The client logs do not depend on the pairing: read them alongside,
            # counting the delay histogram on the way.  (Observed under the
            # send_delays aggregation instead, the metrics of an empty client
            # log never arrive: adaptive execution replaces the plan over the
            # empty shuffle, observation and all.)
            delay_stats = Observation("send_delays")
            delay_metrics = tf.histogram_metrics(tf.delay_seconds(), "delay")
            client_parsed = pool.submit(
                kept.keep,
                tf.parse_client_lines(client_lines).observe(delay_stats, *delay_metrics),
            )
            candidates = paired.result()
            counts = _observed(stats, "lines", classified, event_metrics)
            if collisions is not None and collisions.get[tf.KEY_COLLISIONS_METRIC]:
                # Two keys share a hash (astronomically rare with 64 bits): pair
                # again with the key columns in the partition spec.
                candidates = kept.keep(tf.pair_candidates(classified, key_hash=key_hash))
            # The intervals are the candidates plus the few resolved runs of
            # repeated opens: kept apart, so the candidates are not copied again.
            intervals = tf.finish_intervals(candidates, kept.keep(tf.resolve_runs(candidates)))
            phase("parse+pair")

            window_start_us, window_end_us = counts["window_start_us"], counts["window_end_us"]
            window = _window_frame(spark, window_start_us, window_end_us)
            episodes = tf.episodes_from(intervals)
            blocks = tf.channel_blocks_from(intervals)
            stores = tf.store_episodes_from(intervals)
            episode_stats = Observation("episodes")
            block_stats = Observation("channel_blocks")
            store_stats = Observation("store_episodes")
            episode_metrics = [
                F.count(F.lit(1)).alias("n"),
                F.count(F.when(F.col("open"), F.lit(1))).alias("open"),
            ]
            block_metrics = [
                F.count(F.lit(1)).alias("n"),
                *tf.histogram_metrics(F.col("duration_s"), "block"),
            ]
            store_metrics = [F.count(F.lit(1)).alias("n")]
            writes = [
                pool.submit(
                    _write, episodes.observe(episode_stats, *episode_metrics), out, "episodes"
                ),
                pool.submit(
                    _write, blocks.observe(block_stats, *block_metrics), out, "channel_blocks"
                ),
                pool.submit(
                    _write, stores.observe(store_stats, *store_metrics), out, "store_episodes"
                ),
            ]
            # One aggregation of the episodes serves the summary and the advice.
            episode_aggregates = pool.submit(kept.keep, tf.queue_episode_stats(episodes, window))
            parsed_client = client_parsed.result()
            client = tf.client_flow_records(parsed_client)
            delays_done = pool.submit(
                kept.keep_and_write, tf.send_delays(client), out, "send_delays"
            )
            malformed_done = pool.submit(
                kept.keep_and_write, tf.malformed_from(intervals, parsed_client), out, "malformed"
            )
            queue_stats = episode_aggregates.result()
            summary_done = pool.submit(
                kept.keep_and_write,
                tf.queue_summary_from(queue_stats, blocks, window),
                out,
                "queue_summary",
            )
            limits = None
            if queue_limits is not None:
                limits = spark.createDataFrame(list(queue_limits), QUEUE_LIMITS_SCHEMA)
            advice = kept.keep_and_write(tf.advice_from(queue_stats, client, limits), out, "advice")
            summary = summary_done.result()
            delays = delays_done.result()
            malformed = malformed_done.result()
            for done in writes:
                done.result()
            phase("tables")

            by_overfull = summary.orderBy(F.desc("time_overfull_s"), "vhost", "queue")
            top = by_overfull.limit(TIMELINE_QUEUES)
            queries = {
                "summary": by_overfull.limit(50),
                "timeline": tf.episode_timeline(episodes, window, top, TIMELINE_BUCKETS),
                "timeline_queues": top.select("vhost", "queue"),
                "advice": advice.orderBy(
                    F.coalesce(F.col("stop_ok"), F.lit(True)), F.desc("episodes")
                ).limit(100),
                "malformed": malformed.orderBy(F.desc("count")).limit(200),
                "malformed_reasons": malformed.where(F.col("log") == "gateway")
                .groupBy("reason")
                .agg(F.sum("count").alias("count"))
                .orderBy(F.desc("count"), "reason"),
                "store_episodes": stores.orderBy("start").limit(50),
                "send_delays": delays.orderBy(F.desc_nulls_last("longest_delay_ms")).limit(20),
                "queues_with_episodes": summary.where(F.col("flow_stopped_count") > 0).select(
                    F.count(F.lit(1)).alias("n")
                ),
            }
            rows = dict(zip(queries, pool.map(_rows, queries.values()), strict=True))
            episode_counts = _observed(episode_stats, "n", episodes, episode_metrics)
            block_counts = _observed(block_stats, "n", blocks, block_metrics)
            store_counts = _observed(store_stats, "n", stores, store_metrics)
            delay_counts = _observed(delay_stats, "delay_0", parsed_client, delay_metrics)
    finally:
        # Everything the report needs is collected: drop the kept rows now
        # rather than when the JVM gets round to it.
        kept.release()
    totals = {
        "events": int(counts["lines"]) - int(counts["malformed"]) - int(counts["ignored"]),
        "malformed lines": int(counts["malformed"]),
        "queues with episodes": int(rows["queues_with_episodes"][0]["n"]),
        "flow episodes": int(episode_counts["n"]),
        "open episodes": int(episode_counts["open"]),
        "channel blocks": int(block_counts["n"]),
        "store episodes": int(store_counts["n"]),
    }
    ignored = int(counts["ignored"])
    if ignored:
        totals["other Broker-J lines (not analysed)"] = ignored
    data = ReportData(
        inputs=list(event_paths) + list(client_paths),
        window_start=_utc(window_start_us),
        window_end=_utc(window_end_us),
        totals=totals,
        summary=rows["summary"],
        timeline=rows["timeline"],
        timeline_buckets=TIMELINE_BUCKETS,
        timeline_queues=rows["timeline_queues"],
        block_histogram=tf.histogram_rows(block_counts, "block"),
        delay_histogram=tf.histogram_rows(delay_counts, "delay"),
        advice=rows["advice"],
        malformed=rows["malformed"],
        store_episodes=rows["store_episodes"],
        send_delays=rows["send_delays"],
    )
    write_text_atomically(out / "report.html", render_report(data))
    phase("report")
    return AnalysisResult(
        out=out,
        events=totals["events"],
        malformed=totals["malformed lines"],
        ignored=ignored,
        malformed_reasons=tuple((r["reason"], int(r["count"])) for r in rows["malformed_reasons"]),
        episodes=totals["flow episodes"],
        seconds=time.monotonic() - started,
        phases=phases,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rabbitflow")
    except PackageNotFoundError:
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rabbitflow-analyze",
        description="Analyse rabbitflow gateway event logs (and client logs) with Spark.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        type=str.lower,
        default="warning",
        help="log records of this level and above to stderr (default warning; Spark's own "
        "log stays at ERROR)",
    )
    parser.add_argument("event_logs", nargs="+", metavar="EVENT_LOG", help="files or globs")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument(
        "--client-log", action="append", default=[], metavar="PATH", help="client JSON log"
    )
    parser.add_argument(
        "--queue-limits",
        type=Path,
        metavar="FILE.json",
        help="queue maxima (own format or an admin/management API /api/queues snapshot)",
    )
    parser.add_argument(
        "--default-flow-stop-threshold",
        type=int,
        default=DEFAULT_FLOW_STOP_THRESHOLD,
        metavar="PCT",
        help="the gateway's setting of that name, to find a queue's maximum from its default "
        f"thresholds in a gateway /api/queues snapshot (default {DEFAULT_FLOW_STOP_THRESHOLD})",
    )
    parser.add_argument("--master", help="Spark master URL (default local[2])")
    parser.add_argument(
        "--remote", metavar="sc://HOST:PORT", help="run through a Spark Connect server instead"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--incremental",
        action="store_true",
        help="read only what was added since the last run (checkpoint under --out), then exit",
    )
    mode.add_argument(
        "--follow",
        action="store_true",
        help="keep running: an incremental step every --trigger seconds, until interrupted",
    )
    parser.add_argument(
        "--trigger",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between the starts of two --follow steps (default 10)",
    )
    parser.add_argument(
        "--lateness",
        type=float,
        default=DEFAULT_LATENESS_S,
        metavar="SECONDS",
        help="how late an event of one file may arrive after newer events of another "
        f"(--incremental/--follow; default {DEFAULT_LATENESS_S:.0f})",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the job; returns the process exit status.

    0 on success, 1 when every event-log line was malformed (the commonest
    reason is printed), 2 on bad arguments.  ``spark`` is a session to run
    in (left running); by default the job builds its own and stops it.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    limits = None
    if args.queue_limits is not None:
        try:
            limits = parse_queue_limits(
                json.loads(args.queue_limits.read_text(encoding="utf-8")),
                default_stop_pct=args.default_flow_stop_threshold,
            )
        except (OSError, ValueError) as exc:
            print(f"rabbitflow-analyze: --queue-limits {args.queue_limits}: {exc}", file=sys.stderr)
            return 2
    if args.trigger <= 0 or args.lateness < 0:
        print(
            "rabbitflow-analyze: --trigger must be positive, --lateness not negative",
            file=sys.stderr,
        )
        return 2
    if args.master is not None and args.remote is not None:
        print("rabbitflow-analyze: give --master or --remote, not both", file=sys.stderr)
        return 2
    session = build_session(args.master, remote=args.remote) if spark is None else spark
    try:
        if args.follow:
            return _follow(session, args, limits)
        if args.incremental:
            step = _step(session, args, limits, live=False)
            return 1 if step.all_malformed else 0
        result = analyze(
            session, args.event_logs, args.out, client_paths=args.client_log, queue_limits=limits
        )
    finally:
        if spark is None:
            session.stop()
    print(
        f"rabbitflow-analyze: {result.events:,} events, {result.malformed:,} malformed lines, "
        f"{result.episodes:,} flow episodes in {result.seconds:.1f}s → {result.out}"
    )
    if result.all_malformed:
        reason, count = result.malformed_reasons[0]
        _all_malformed(result.malformed, reason, count)
        return 1
    return 0


def _all_malformed(malformed: int, reason: str, count: int) -> None:
    print(
        f"rabbitflow-analyze: error: every one of the {malformed:,} event-log lines "
        f"is malformed; commonest reason: {reason} ({count:,} lines). Expected the "
        "gateway's JSON event records or Broker-J operational log lines "
        "(see the malformed table and docs/pipeline.md)",
        file=sys.stderr,
    )


def _step(
    session: SparkSession,
    args: argparse.Namespace,
    limits: list[tuple[str, str, int | None, int | None]] | None,
    *,
    live: bool,
) -> StepResult:
    result = run_step(
        session,
        args.event_logs,
        args.out,
        client_paths=args.client_log,
        queue_limits=limits,
        lateness_s=args.lateness,
        live=live,
    )
    _print_step(result)
    if not result.changed:
        print(f"rabbitflow-analyze: no new input since step {result.batch}", flush=True)
    return result


def _print_step(result: StepResult) -> None:
    if result.changed:
        print(
            f"rabbitflow-analyze: step {result.batch}: {result.new_bytes:,} new bytes; "
            f"{result.events:,} events, {result.malformed:,} malformed lines, "
            f"{result.episodes:,} flow episodes ({result.open_episodes:,} open) "
            f"in {result.seconds:.1f}s → {result.out}",
            flush=True,
        )
    if result.all_malformed and result.malformed_reasons:
        reason, count = result.malformed_reasons[0]
        _all_malformed(result.malformed, reason, count)


def _follow(
    session: SparkSession,
    args: argparse.Namespace,
    limits: list[tuple[str, str, int | None, int | None]] | None,
) -> int:
    """Steps every ``--trigger`` seconds until SIGINT/SIGTERM (the step under way finishes)."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, request_stop)
    try:
        follow(
            session,
            args.event_logs,
            args.out,
            trigger_s=args.trigger,
            stop=stop,
            on_step=_print_step,
            client_paths=args.client_log,
            queue_limits=limits,
            lateness_s=args.lateness,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
