"""The Spark session the pipeline runs in: local by default, a cluster's, or Spark Connect."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["SPARK_CONF", "build_session", "is_connect"]

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
    # PySpark records the Python call site of every DataFrame function call
    # for error messages: four round trips to the JVM per call (the active
    # session, a setting, the origin set and cleared).  With it off (and the
    # event schema built once) a warm incremental step at 1,000,000 events
    # made 7,900 calls into the JVM instead of 32,000.  Errors still name
    # the failing expression.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


#: Settings of a JVM in this process, not for a Spark Connect server.
_CLASSIC_ONLY = (
    "spark.sql.codegen.cache.maxEntries",
    "spark.python.sql.dataFrameDebugging.enabled",
)


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
            if key not in _CLASSIC_ONLY:
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


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (``--remote``) rather than one with a JVM in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
