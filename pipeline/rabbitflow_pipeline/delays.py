"""The ``send_delays`` table: per producer and destination, how long sends waited."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.inputs import is_wait

__all__ = ["merge_send_delays", "producer_capacities", "send_delays"]


def send_delays(client: DataFrame) -> DataFrame:
    """Per (producer, destination): longest delay, delayed notices, timeouts, capacity.

    ``longest_delay_ms`` is the largest ``waited_ms`` of a delay notice or
    timeout; ``delayed_notices`` counts "send delayed" warnings;
    ``timeouts`` counts "send failed" errors; ``capacity`` is the largest
    producer capacity the records carried (null when none did).
    """
    waits = is_wait()
    return client.groupBy("producer", "destination").agg(
        F.max(F.when(waits, F.col("waited_ms"))).alias("longest_delay_ms"),
        F.sum((F.col("flow_event") == "send_delayed").cast("long")).alias("delayed_notices"),
        F.sum((F.col("flow_event") == "send_failed").cast("long")).alias("timeouts"),
        F.sum((F.col("flow_event") == "flow_enforced").cast("long")).alias("flow_enforced"),
        F.max("capacity").alias("capacity"),
        F.min("timestamp").alias("first_seen"),
        F.max("timestamp").alias("last_seen"),
    )


def merge_send_delays(delays: DataFrame) -> DataFrame:
    """:func:`send_delays` of the whole client log from its rows for parts of it."""
    return delays.groupBy("producer", "destination").agg(
        F.max("longest_delay_ms").alias("longest_delay_ms"),
        F.sum("delayed_notices").alias("delayed_notices"),
        F.sum("timeouts").alias("timeouts"),
        F.sum("flow_enforced").alias("flow_enforced"),
        F.max("capacity").alias("capacity"),
        F.min("first_seen").alias("first_seen"),
        F.max("last_seen").alias("last_seen"),
    )


def producer_capacities(client: DataFrame) -> DataFrame:
    """The largest capacity each producer reported per destination (client flow records).

    Columns ``destination``, ``producer``, ``capacity``; what
    :func:`send_delays` keeps as ``capacity`` too.
    """
    return (
        client.where(F.col("capacity").isNotNull() & F.col("destination").isNotNull())
        .groupBy("destination", "producer")
        .agg(F.max("capacity").alias("capacity"))
    )
