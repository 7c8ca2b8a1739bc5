"""What the batch and the incremental job share around the transforms: kept rows, writes, report.

:class:`Kept` holds rows on the executors for the length of a run,
:func:`write_table` writes a table as both jobs do, and
:func:`collect_report` gathers what ``report.html`` shows from the tables
(small ones collected whole, large ones only aggregated).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline.episodes import episode_timeline

__all__ = [
    "TIMELINE_BUCKETS",
    "TIMELINE_QUEUES",
    "Kept",
    "Phases",
    "arrow_rows",
    "open_now",
    "read_arrow",
    "rows",
    "utc",
    "window_frame",
    "window_of",
    "write_arrow",
    "write_table",
]

TIMELINE_BUCKETS = 240
TIMELINE_QUEUES = 30

_EPOCH = dt.datetime(1970, 1, 1)

#: Columns whose values are nearly all distinct (times and durations): a
#: Parquet dictionary for them is built, outgrows its page and is dropped,
#: so the writer is told not to try.
_UNIQUE_COLUMNS = ("start", "end", "duration_s", "first_seen", "last_seen")


def write_table(df: DataFrame, path: Path, *, partition_by: str | None = None) -> None:
    """Write ``df`` as a Parquet directory at ``path`` (replacing it), in a
    subdirectory per value of ``partition_by`` if given."""
    plain = {f"parquet.enable.dictionary#{c}": "false" for c in _UNIQUE_COLUMNS if c in df.columns}
    writer = df.write.mode("overwrite").options(**plain)
    if partition_by is not None:
        writer = writer.partitionBy(partition_by)
    writer.parquet(str(path))


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """``df`` collected as dictionaries, timestamps as naive UTC datetimes (the
    report's times).

    Fetched as Arrow: ``collect()`` would give each timestamp in the Python
    process's local time zone, which the report would show labelled UTC.
    """
    return arrow_rows(df.toArrow())


def arrow_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table``'s rows as dictionaries, as :func:`rows` gives a DataFrame's, but
    with timestamps as naive UTC datetimes (the report's times) whatever the
    local time zone."""
    columns = [
        column.cast(pa.timestamp("us")) if pa.types.is_timestamp(column.type) else column
        for column in table.columns
    ]
    converted: list[dict[str, Any]] = pa.table(columns, names=table.column_names).to_pylist()
    return converted


def write_arrow(table: pa.Table, directory: Path, name: str) -> None:
    """Write ``table`` as the Parquet file ``directory/name``, atomically (a small
    table's rows, already in the driver: no Spark job).  Spark reads it as it
    reads its own files (timestamps are int64 microseconds in UTC, as
    ``spark.sql.parquet.outputTimestampType`` makes Spark write them)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{name}.partial"
    pq.write_table(table, partial)
    os.replace(partial, directory / name)


def read_arrow(paths: Sequence[Path]) -> pa.Table:
    """The rows of the Parquet files ``paths`` (written by Spark or by :func:`write_arrow`)."""
    return pa.concat_tables([pq.read_table(path) for path in paths], promote_options="permissive")


def utc(micros: int | None) -> dt.datetime | None:
    """A naive UTC datetime from microseconds since the epoch (the report's times)."""
    return None if micros is None else _EPOCH + dt.timedelta(microseconds=micros)


def window_frame(spark: SparkSession, start_us: int | None, end_us: int | None) -> DataFrame:
    """The one-row observed window from its bounds in microseconds.

    Columns ``window_start``, ``window_end`` (timestamps) and ``window_s``.
    Built from literals, not ``createDataFrame``: a DataFrame of Python rows
    starts a Python worker to read them back (about 2 s in local mode).
    """
    bounds = spark.range(1).select(
        F.lit(start_us).cast("long").alias("start_us"), F.lit(end_us).cast("long").alias("end_us")
    )
    return window_of(bounds)


def window_of(bounds: DataFrame) -> DataFrame:
    """The observed window (as :func:`window_frame`) from a one-row frame of its bounds,
    columns ``start_us`` and ``end_us`` (microseconds, long)."""
    start, end = F.col("start_us"), F.col("end_us")
    return bounds.select(
        F.timestamp_micros(start).alias("window_start"),
        F.timestamp_micros(end).alias("window_end"),
        ((end - start) / F.lit(1_000_000.0)).alias("window_s"),
    )


def queue_frame(spark: SparkSession, queues: Sequence[Mapping[str, Any]]) -> DataFrame:
    """(vhost, queue) pairs as a DataFrame of literals (no Python worker to read them)."""
    pairs = [
        F.struct(F.lit(q["vhost"]).alias("vhost"), F.lit(q["queue"]).alias("queue")) for q in queues
    ]
    if not pairs:
        return spark.range(0).select(
            F.lit(None).cast("string").alias("vhost"), F.lit(None).cast("string").alias("queue")
        )
    return spark.range(1).select(F.inline(F.array(*pairs)))


def open_now(episodes: DataFrame, blocks: DataFrame, stores: DataFrame) -> DataFrame:
    """The open episodes, channel blocks and store episodes, oldest first (a live report)."""
    no_long = F.lit(None).cast("long")
    return (
        episodes.where(F.col("open"))
        .select(
            F.lit("queue").alias("kind"),
            "vhost",
            "queue",
            no_long.alias("connection"),
            no_long.alias("channel"),
            "start",
        )
        .unionByName(
            blocks.where(F.col("open")).select(
                F.lit("channel").alias("kind"), "vhost", "queue", "connection", "channel", "start"
            )
        )
        .unionByName(
            stores.where(F.col("open")).select(
                F.lit("store").alias("kind"),
                "vhost",
                F.lit(None).cast("string").alias("queue"),
                no_long.alias("connection"),
                no_long.alias("channel"),
                "start",
            )
        )
        .orderBy("start")
        .limit(200)
    )


def timeline_rows(
    spark: SparkSession, episodes: DataFrame, window: DataFrame, top: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The report's timeline rows for the ``top`` queues (none to draw: no Spark job)."""
    if not top:
        return []
    frame = queue_frame(spark, top)
    return rows(episode_timeline(episodes, window, frame, TIMELINE_BUCKETS))


class Kept:
    """Rows kept on the executors while a run needs them, released at its end.

    Rows are kept as local checkpoints: cheaper than ``cache()`` for rows
    read a few times in full (no columnar encoding), and the lineage is cut
    so later jobs start from the rows.  Spark would hold the blocks until
    the JVM collects the checkpointed data, so a long-lived session running
    the job again would carry them into its next jobs: :meth:`release`
    drops them as soon as the run is over.
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

    def keep_and_write(self, df: DataFrame, path: Path) -> DataFrame:
        """:meth:`keep` ``df``, then write it at ``path``; returns the kept rows."""
        kept = self.keep(df)
        write_table(kept, path)
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


class Phases:
    """Seconds spent in each phase of a run; ``hook`` sees each phase's name as it ends."""

    def __init__(self, hook: Callable[[str], None] | None = None) -> None:
        self.started = self._mark = time.monotonic()
        self.seconds: dict[str, float] = {}
        self._hook = hook

    def passed(self, name: str) -> None:
        """Phase ``name`` ends now."""
        now = time.monotonic()
        self.seconds[name] = now - self._mark
        self._mark = now
        if self._hook is not None:
            self._hook(name)
