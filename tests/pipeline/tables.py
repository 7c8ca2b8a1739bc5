"""Compare the tables two runs wrote, read with pyarrow (no Spark job).

The incremental and cluster tests compare whole output directories many
times; reading them with Spark cost a few jobs per table (seconds per
comparison on a small machine), reading them here costs milliseconds.
The check is the one ``assertDataFrameEqual`` makes: the same columns of
the same types (nullability aside), the same rows in any order, floats
equal to a relative 1e-5.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rabbitflow_pipeline.batch import TABLES

__all__ = ["assert_same_tables", "rows"]


def _spark_type(arrow: Any) -> str:
    """The type as Spark reads it: a timestamp is one type whatever its unit and zone."""
    if pa.types.is_timestamp(arrow):
        return "timestamp"
    return str(arrow)


def rows(path: Path) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    """A table's columns (name, type) and its rows, sorted (nulls first)."""
    table = pq.read_table(path)
    columns = [(field.name, _spark_type(field.type)) for field in table.schema]
    records = [tuple(r.values()) for r in table.to_pylist()]
    return columns, sorted(records, key=lambda r: [(v is not None, str(v)) for v in r])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-8)
    return bool(a == b)


def assert_same_tables(actual: Path, expected: Path) -> None:
    """Every table of the batch job under ``actual`` equals the one under ``expected``."""
    for table in TABLES:
        columns, got = rows(actual / table)
        expected_columns, want = rows(expected / table)
        assert columns == expected_columns, table
        assert len(got) == len(want), (table, len(got), len(want))
        for a, b in zip(got, want, strict=True):
            assert all(_same(x, y) for x, y in zip(a, b, strict=True)), (table, a, b)
