"""The ``store_episodes`` table."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.pairing import flow_intervals
from rabbitflow_pipeline.schemas import STORE_EPISODES_SCHEMA

__all__ = ["store_episodes", "store_episodes_from"]


def store_episodes_from(intervals: DataFrame) -> DataFrame:
    """The ``store_episodes`` table from :func:`flow_intervals`."""
    return intervals.where(F.col("kind") == "store").select(*STORE_EPISODES_SCHEMA.fieldNames())


def store_episodes(events: DataFrame) -> DataFrame:
    """Store episodes per vhost: MST-1008 to the next MST-1009.

    Columns of :data:`rabbitflow_pipeline.schemas.STORE_EPISODES_SCHEMA`.
    """
    return store_episodes_from(flow_intervals(events))
