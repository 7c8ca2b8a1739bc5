"""The ``episodes`` table, its per-queue statistics and the report's timeline of it."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.pairing import flow_intervals, seconds_between
from rabbitflow_pipeline.schemas import EPISODES_SCHEMA

__all__ = [
    "episode_timeline",
    "episodes_from",
    "observed_window",
    "queue_episode_stats",
    "queue_episodes",
    "sorted_percentile",
]


def episodes_from(intervals: DataFrame) -> DataFrame:
    """The ``episodes`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "queue").select(*EPISODES_SCHEMA.fieldNames())


def queue_episodes(events: DataFrame) -> DataFrame:
    """Flow episodes per (vhost, queue): QUE-1003 to the next QUE-1004.

    Columns of :data:`rabbitflow_pipeline.schemas.EPISODES_SCHEMA`.
    """
    return episodes_from(flow_intervals(events))


def observed_window(events: DataFrame) -> DataFrame:
    """One row: ``window_start``, ``window_end``, ``window_s`` of all events."""
    return events.agg(
        F.min("ts").alias("window_start"), F.max("ts").alias("window_end")
    ).withColumn("window_s", seconds_between(F.col("window_start"), F.col("window_end")))


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

    The percentiles are Spark's exact ``percentile``, taken from each
    queue's values collected and sorted (:func:`sorted_percentile`): the
    same numbers, for less work (``percentile`` keeps a hash map of the
    values and serializes it between the aggregation's stages).
    """
    effective = _with_overfull_us(episodes, window)
    drain_rate = F.when(
        (F.col("duration_s") > 0) & (F.col("start_messages") >= F.col("end_messages")),
        (F.col("start_messages") - F.col("end_messages")) / F.col("duration_s"),
    )
    closed = ~F.col("open")
    stats = effective.groupBy("vhost", "queue").agg(
        F.count(F.lit(1)).alias("flow_stopped_count"),
        (F.sum("_overfull_us") / F.lit(1_000_000.0)).alias("time_overfull_s"),
        F.sum(F.col("open").cast("long")).alias("open_episodes"),
        # Nulls (open episodes) are not collected.
        F.sort_array(F.collect_list("duration_s")).alias("_durations"),
        F.sort_array(F.collect_list(drain_rate)).alias("_drain_rates"),
        # The latest episode's start and stop thresholds, the latest closed
        # one's start and resume thresholds (on equal starts, the greatest).
        F.max(F.struct("start", "stop_count", "stop_size")).alias("_latest"),
        F.max(F.when(closed, F.struct("start", "resume_count", "resume_size"))).alias(
            "_latest_closed"
        ),
    )
    durations = F.col("_durations")
    return stats.select(
        "vhost",
        "queue",
        "flow_stopped_count",
        "time_overfull_s",
        "open_episodes",
        sorted_percentile(durations, 0.5).alias("duration_p50_s"),
        sorted_percentile(durations, 0.95).alias("duration_p95_s"),
        F.array_max(durations).alias("duration_max_s"),
        F.col("_latest.stop_count").alias("stop_count"),
        F.col("_latest.stop_size").alias("stop_size"),
        F.col("_latest_closed.resume_count").alias("resume_count"),
        F.col("_latest_closed.resume_size").alias("resume_size"),
        sorted_percentile(F.col("_drain_rates"), 0.5).alias("drain_rate_msgs_s"),
    )


def _with_overfull_us(episodes: DataFrame, window: DataFrame | None) -> DataFrame:
    """``episodes`` with ``_overfull_us``: each one's time overfull (an open one's to the
    end of ``window``), in whole microseconds, null without a window.

    Whole microseconds add up exactly, so the total does not depend on the
    order Spark happens to add the episodes in.
    """
    if window is None:
        return episodes.select("*", F.lit(None).cast("long").alias("_overfull_us"))
    end = F.coalesce(F.col("end"), F.col("window_end"))
    return episodes.crossJoin(F.broadcast(window)).select(
        *episodes.columns,
        (F.unix_micros(end) - F.unix_micros(F.col("start"))).alias("_overfull_us"),
    )


def sorted_percentile(values: Column, percentage: float) -> Column:
    """The exact ``percentage`` percentile of a sorted array of doubles (null when empty).

    Spark's ``percentile``, computed the same way to the last bit: the value
    at position ``(n - 1) * percentage``, interpolated linearly between the
    two values around it.
    """
    n = F.size(values)
    position = (n - F.lit(1)).cast("double") * F.lit(percentage)
    lower, higher = F.floor(position), F.ceil(position)
    low = F.get(values, lower.cast("int"))
    high = F.get(values, higher.cast("int"))
    interpolated = low + (position - lower) * (high - low)
    return F.when(n > 0, F.when((higher == lower) | (low == high), low).otherwise(interpolated))


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
    w = F.broadcast(_slices(window, buckets))
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


def _slices(window: DataFrame, buckets: int) -> DataFrame:
    """The window's bounds (``_ws``, ``_we``) and its slice width (``_bw``), in microseconds."""
    return window.select(
        F.unix_micros("window_start").alias("_ws"),
        F.unix_micros("window_end").alias("_we"),
        F.greatest(
            F.ceil((F.unix_micros("window_end") - F.unix_micros("window_start")) / buckets),
            F.lit(1),
        ).alias("_bw"),
    )
