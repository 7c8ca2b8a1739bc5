"""What the Spark tests read from the session's JVM."""

from __future__ import annotations

from pyspark.sql import SparkSession

__all__ = ["compiled_classes"]


def compiled_classes(spark: SparkSession) -> int:
    """Classes of generated code Spark has compiled in this JVM so far."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    metrics = getattr(jvm.org.apache.spark.metrics.source, "CodegenMetrics$").__getattr__("MODULE$")
    return int(metrics.METRIC_COMPILATION_TIME().getCount())
