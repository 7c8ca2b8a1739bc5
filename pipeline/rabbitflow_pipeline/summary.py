"""The ``queue_summary`` table: per queue, flow stops, time overfull, channels blocked."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.blocks import blocked_channels
from rabbitflow_pipeline.episodes import queue_episode_stats

__all__ = ["queue_summary", "queue_summary_from", "queue_summary_of_channels"]


def queue_summary(episodes: DataFrame, blocks: DataFrame, window: DataFrame) -> DataFrame:
    """Per (vhost, queue): flow stops, time overfull, episode durations, channels blocked.

    ``flow_stopped_count`` counts episodes (the gateway's flowStoppedCount
    over the log); ``time_overfull_s`` adds an open episode's time up to
    the end of the observed window; ``pct_time_overfull`` is relative to
    that window.  Duration percentiles are exact, over closed episodes.
    ``channels_blocked`` counts distinct (source, connection, channel)
    blocked on the queue; store/admin blocks (``** All Queues **``) are not
    attributed to a queue.
    """
    return queue_summary_from(queue_episode_stats(episodes, window), blocks, window)


def queue_summary_from(stats: DataFrame, blocks: DataFrame, window: DataFrame) -> DataFrame:
    """:func:`queue_summary` from :func:`queue_episode_stats` (computed with ``window``)."""
    return queue_summary_of_channels(stats, blocked_channels(blocks), window)


def queue_summary_of_channels(
    stats: DataFrame, channels: DataFrame, window: DataFrame
) -> DataFrame:
    """:func:`queue_summary_from` with the blocks already counted by :func:`blocked_channels`.

    ``channels`` may list a channel more than once (its counts add up).
    """
    identified = (
        F.col("source").isNotNull() & F.col("connection").isNotNull() & F.col("channel").isNotNull()
    )
    per_channel = (
        channels.groupBy("vhost", "queue", "source", "connection", "channel")
        .agg(F.sum("blocks").alias("blocks"))
        .groupBy("vhost", "queue")
        .agg(
            F.count(F.when(identified, F.lit(1))).alias("channels_blocked"),
            F.sum("blocks").alias("channel_blocks"),
        )
    )
    per_queue = stats.select(
        "vhost",
        "queue",
        "flow_stopped_count",
        "time_overfull_s",
        "open_episodes",
        "duration_p50_s",
        "duration_p95_s",
        "duration_max_s",
    )
    joined = per_queue.join(per_channel, ["vhost", "queue"], "full_outer").crossJoin(
        F.broadcast(window)
    )
    time_overfull = F.coalesce(F.col("time_overfull_s"), F.lit(0.0))
    return joined.select(
        "vhost",
        "queue",
        F.coalesce(F.col("flow_stopped_count"), F.lit(0)).alias("flow_stopped_count"),
        time_overfull.alias("time_overfull_s"),
        F.when(F.col("window_s") > 0, time_overfull * 100.0 / F.col("window_s")).alias(
            "pct_time_overfull"
        ),
        F.coalesce(F.col("open_episodes"), F.lit(0)).alias("open_episodes"),
        "duration_p50_s",
        "duration_p95_s",
        "duration_max_s",
        F.coalesce(F.col("channels_blocked"), F.lit(0)).alias("channels_blocked"),
        F.coalesce(F.col("channel_blocks"), F.lit(0)).alias("channel_blocks"),
    )
