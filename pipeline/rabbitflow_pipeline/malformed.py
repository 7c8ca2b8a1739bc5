"""The ``malformed`` table: malformed lines counted per (log, source, reason)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.inputs import is_malformed

__all__ = ["malformed_from", "malformed_reasons", "malformed_summary"]


def malformed_summary(
    parsed_events: DataFrame, parsed_client: DataFrame | None = None
) -> DataFrame:
    """Count malformed lines per (log, source, reason).

    ``log`` is ``gateway`` or ``client``; client lines that are merely not
    flow records (``ignored``) are not malformed and not counted.
    """
    gateway = parsed_events.where(is_malformed(F.col("malformed_reason"))).select(
        F.lit("gateway").alias("log"), "source", F.col("malformed_reason").alias("reason")
    )
    return _count_malformed(gateway, parsed_client)


def _count_malformed(gateway: DataFrame, parsed_client: DataFrame | None) -> DataFrame:
    frames = gateway
    if parsed_client is not None:
        client = parsed_client.where(
            F.col("malformed_reason").isNotNull() & (F.col("malformed_reason") != "ignored")
        ).select(F.lit("client").alias("log"), "source", F.col("malformed_reason").alias("reason"))
        frames = frames.unionByName(client)
    return frames.groupBy("log", "source", "reason").agg(F.count(F.lit(1)).alias("count"))


def malformed_from(intervals: DataFrame, parsed_client: DataFrame | None = None) -> DataFrame:
    """The ``malformed`` table from :func:`flow_intervals` (and parsed client lines)."""
    gateway = intervals.where(F.col("kind") == "malformed").select(
        F.lit("gateway").alias("log"), "source", "reason"
    )
    return _count_malformed(gateway, parsed_client)


def malformed_reasons(malformed: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, int], ...]:
    """Malformed event-log lines per reason, commonest first, from the ``malformed`` rows."""
    per_reason: dict[str, int] = {}
    for row in malformed:
        if row["log"] == "gateway":
            per_reason[row["reason"]] = per_reason.get(row["reason"], 0) + int(row["count"])
    return tuple(sorted(per_reason.items(), key=lambda item: (-item[1], item[0])))
