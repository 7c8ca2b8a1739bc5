"""The ``channel_blocks`` table and its counts per blocked channel."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.pairing import flow_intervals
from rabbitflow_pipeline.schemas import (
    ALL_QUEUES,
    CHANNEL_BLOCKS_SCHEMA,
)

__all__ = ["blocked_channels", "channel_blocks", "channel_blocks_from"]


def channel_blocks_from(intervals: DataFrame) -> DataFrame:
    """The ``channel_blocks`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "channel").select(*CHANNEL_BLOCKS_SCHEMA.fieldNames())


def channel_blocks(events: DataFrame) -> DataFrame:
    """Channel blocks: CHN-1005 to the next CHN-1006/CHN-1012 per (source, connection, channel).

    ``queue`` is the queue named by CHN-1005 (``** All Queues **`` for a
    store or administrator block); ``closed_by`` is the closing code.
    Columns of :data:`rabbitflow_pipeline.schemas.CHANNEL_BLOCKS_SCHEMA`.
    """
    return channel_blocks_from(flow_intervals(events))


def blocked_channels(blocks: DataFrame) -> DataFrame:
    """Channel blocks counted per queue and channel (store/admin blocks left out).

    Columns ``vhost``, ``queue``, ``source``, ``connection``, ``channel``,
    ``blocks``.  Counts add up: the incremental job adds each step's to
    the ones it stored.
    """
    return (
        blocks.where(F.col("queue") != ALL_QUEUES)
        .groupBy("vhost", "queue", "source", "connection", "channel")
        .agg(F.count(F.lit(1)).alias("blocks"))
    )
