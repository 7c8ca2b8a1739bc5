"""One local Spark session for the whole pipeline test session."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from rabbitflow_pipeline.session import SPARK_CONF


def pytest_configure(config: pytest.Config) -> None:
    # py4j logs every gateway command at DEBUG, drowning test output.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Spark's Python layer emits these from inside pyspark; they are not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:pyspark.*")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Timestamps collected to Python are rendered in the process's zone:
    # pin it to UTC so expected tables can be written in UTC.
    os.environ["TZ"] = "UTC"
    time.tzset()
    # Python workers (sink tests) must run this interpreter, which has rabbitflow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("rabbitflow-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # One JVM runs every pipeline test: hundreds of distinct plans whose
        # generated classes SPARK_CONF keeps cached, plus local checkpoints.
        # Spark's default 1 GiB heap ran out late in the suite (OutOfMemoryError,
        # then every later Spark test failed); the job itself runs with 4 GiB.
        .config("spark.driver.memory", "3g")
        # Adaptive execution stays on, as in the job (Spark's default).
        .config("spark.sql.adaptive.enabled", "true")
    )
    # The settings the job's own session runs with (rabbitflow_pipeline.session).
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
