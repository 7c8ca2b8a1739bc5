"""Duration histograms (the report's block and delay charts)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = ["DEFAULT_HISTOGRAM_EDGES_S", "duration_histogram", "histogram_metrics", "histogram_rows"]

#: Bucket edges (seconds) of the delay histogram; the last bucket is open.
DEFAULT_HISTOGRAM_EDGES_S: tuple[float, ...] = (0, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


def _check_edges(edges: Sequence[float]) -> None:
    if not edges or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"histogram edges must be increasing, got {list(edges)!r}")


def _bucket(value: Column, edges: Sequence[float]) -> Column:
    """The index of the last edge ``value`` reaches; null below the first edge or for null."""
    bucket: Column = F.lit(None).cast("int")
    for index in range(len(edges)):
        bucket = F.when(value >= F.lit(float(edges[index])), F.lit(index)).otherwise(bucket)
    return bucket


def duration_histogram(
    durations: DataFrame, column: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> DataFrame:
    """Count non-null ``column`` values (seconds) per bucket ``[lower, upper)``.

    Returns ``bucket``, ``lower_s``, ``upper_s`` (null for the last, open
    bucket) and ``count``, one row per bucket including empty ones.

    Raises:
        ValueError: fewer than one edge, or edges not increasing.
    """
    _check_edges(edges)
    value = F.col(column)
    counts = (
        durations.where(value.isNotNull() & (value >= F.lit(float(edges[0]))))
        .select(_bucket(value, edges).alias("bucket"))
        .groupBy("bucket")
        .agg(F.count(F.lit(1)).alias("count"))
    )
    spark = durations.sparkSession
    buckets = spark.createDataFrame(
        [
            (i, float(lo), float(edges[i + 1]) if i + 1 < len(edges) else None)
            for i, lo in enumerate(edges)
        ],
        "bucket int, lower_s double, upper_s double",
    )
    return buckets.join(F.broadcast(counts), "bucket", "left").select(
        "bucket", "lower_s", "upper_s", F.coalesce(F.col("count"), F.lit(0)).alias("count")
    )


def histogram_metrics(
    value: Column, name: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> list[Column]:
    """Aggregate columns counting ``value`` per bucket, for :meth:`DataFrame.observe`.

    The same buckets as :func:`duration_histogram`, counted while another
    action (a table write) reads the rows; :func:`histogram_rows` turns the
    observed metrics into that function's rows.

    Raises:
        ValueError: fewer than one edge, or edges not increasing.
    """
    _check_edges(edges)
    bucket = _bucket(value, edges)
    return [
        F.count(F.when(bucket == F.lit(i), F.lit(1))).alias(f"{name}_{i}")
        for i in range(len(edges))
    ]


def histogram_rows(
    metrics: Mapping[str, Any], name: str, edges: Sequence[float] = DEFAULT_HISTOGRAM_EDGES_S
) -> list[dict[str, Any]]:
    """The rows of :func:`duration_histogram` from :func:`histogram_metrics`' observed values."""
    return [
        {
            "bucket": i,
            "lower_s": float(lo),
            "upper_s": float(edges[i + 1]) if i + 1 < len(edges) else None,
            "count": int(metrics[f"{name}_{i}"]),
        }
        for i, lo in enumerate(edges)
    ]
