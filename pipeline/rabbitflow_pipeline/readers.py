"""Reading the inputs: gateway event records and client-log lines, with the file of each."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline.schemas import CORRUPT_COLUMN, EVENT_WIRE_SCHEMA, LINES_SCHEMA

__all__ = ["ROTATED_SUFFIX", "event_records", "read_events", "read_lines", "stream_of"]

#: The suffix a rotated copy of a log has: ``events.jsonl.1`` is ``events.jsonl``
#: renamed by the gateway's rotation (and by logrotate's and Python's
#: ``RotatingFileHandler``).  The same pattern in Java and Python regexes.
ROTATED_SUFFIX = r"\.[0-9]+$"


def stream_of(uri: str) -> str:
    """The log a file belongs to: its URI without a rotation suffix.

    A row's ``source`` names the log, not the file: the lines of
    ``events.jsonl.1`` and of the ``events.jsonl`` that followed it are one
    stream of one gateway, so a channel block opened before a rotation is
    closed by its CHN-1006 after it, whichever file each line is in.
    """
    return re.sub(ROTATED_SUFFIX, "", uri)


def _source() -> Column:
    """:func:`stream_of` the file each row was read from."""
    return F.regexp_replace(F.input_file_name(), ROTATED_SUFFIX, "")


def read_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Lines of text files (globs allowed) with the log each came from (``source``,
    :func:`stream_of` its file)."""
    if not paths:
        return spark.createDataFrame([], LINES_SCHEMA)
    return spark.read.text(list(paths)).select("value", _source().alias("source"))


def read_events(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Raw gateway event records (``EVENT_WIRE_SCHEMA`` + ``source``) of files or globs.

    Spark's JSON source with the explicit schema: no inference pass, a line
    that is not JSON lands in the corrupt-record column, blank lines are
    skipped.  ``source`` is :func:`stream_of` ``input_file_name()``
    (``file:///dir/gw.jsonl``, for ``gw.jsonl.1`` too): the
    ``_metadata.file_path`` column (``file:/dir/gw.jsonl``) costs about a
    third more per parsed line (measured on the benchmark logs).
    """
    return event_records(spark, paths).select("*", _source().alias("source"))


def event_records(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Raw gateway event records (``EVENT_WIRE_SCHEMA``) of files or globs, without ``source``.

    What :func:`read_events` reads; the incremental step names the source itself.
    """
    return (
        spark.read.schema(EVENT_WIRE_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(list(paths))
    )
