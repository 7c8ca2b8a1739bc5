"""The incremental step's per-queue episode statistics, kept as a running state.

A settled episode never changes (see :mod:`rabbitflow_pipeline.settling`),
so the statistics the summary and advice read
(:func:`~rabbitflow_pipeline.episodes.queue_episode_stats`) are kept per
queue in ``_state/stats/vN/``: counts, the time overfull in whole
microseconds, the latest thresholds, and the sorted durations and drain
rates the exact percentiles are taken from.  Each step fetches its own
episodes (one small job over the rows it keeps anyway), adds the settled
ones to the stored statistics, and computes the ``queue_stats`` table from
those and its provisional ones, in the driver: no Spark job reads the
episodes of earlier steps, and none re-sorts them.  The numbers are those
of :func:`~rabbitflow_pipeline.episodes.queue_episode_stats`, to the last
bit (a test compares them over random episodes cut in random steps).

A checkpoint written before this state existed has none: its settled
episodes are then read once, and the state starts from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline.episodes import queue_episode_stats
from rabbitflow_pipeline.schemas import EPISODES_SCHEMA
from rabbitflow_pipeline.settling import StepState, arrow_frame

__all__ = [
    "STATS_AREA",
    "QueueStats",
    "added",
    "fold_episodes",
    "running_queue_stats",
    "stats_table",
]

#: The ``_state`` area of the stored statistics.
STATS_AREA = "stats"
_STATS_FILE = "stats.parquet"

#: The episode columns the statistics read.
_COLUMNS = (
    "vhost",
    "queue",
    "start",
    "end",
    "duration_s",
    "open",
    "start_messages",
    "end_messages",
    "stop_count",
    "stop_size",
    "resume_count",
    "resume_size",
)

Key = tuple[str | None, str | None]
Values = npt.NDArray[np.float64]
#: A threshold struct as Spark compares it: the start, then each field (null first).
Latest = tuple[int, int | None, int | None]


def _order(latest: Latest) -> tuple[Any, ...]:
    return tuple((value is not None, value if value is not None else 0) for value in latest)


def _later(a: Latest | None, b: Latest | None) -> Latest | None:
    """Spark's ``max`` of two structs (nulls ignored)."""
    if a is None or b is None:
        return a if b is None else b
    return a if _order(a) >= _order(b) else b


@dataclass
class QueueStats:
    """One queue's statistics over some of its episodes; :meth:`plus` adds two."""

    count: int = 0
    #: Null while no episode had a time overfull (no window).
    overfull_us: int | None = None
    open: int = 0
    durations: Values = field(default_factory=lambda: _EMPTY)
    drain_rates: Values = field(default_factory=lambda: _EMPTY)
    latest: Latest | None = None
    latest_closed: Latest | None = None

    def plus(self, other: QueueStats) -> QueueStats:
        """Both together (the sorted values merged: a stable sort of two sorted runs)."""
        overfull = self.overfull_us
        if other.overfull_us is not None:
            overfull = other.overfull_us + (overfull or 0)
        return QueueStats(
            self.count + other.count,
            overfull,
            self.open + other.open,
            _merged(self.durations, other.durations),
            _merged(self.drain_rates, other.drain_rates),
            _later(self.latest, other.latest),
            _later(self.latest_closed, other.latest_closed),
        )

    def row(self, key: Key) -> dict[str, Any]:
        """The row of :func:`queue_episode_stats` these statistics give."""
        latest = self.latest or (0, None, None)
        closed = self.latest_closed or (0, None, None)
        return {
            "vhost": key[0],
            "queue": key[1],
            "flow_stopped_count": self.count,
            "time_overfull_s": None if self.overfull_us is None else self.overfull_us / 1_000_000.0,
            "open_episodes": self.open,
            "duration_p50_s": _percentile(self.durations, 0.5),
            "duration_p95_s": _percentile(self.durations, 0.95),
            "duration_max_s": float(self.durations[-1]) if len(self.durations) else None,
            "stop_count": latest[1],
            "stop_size": latest[2],
            "resume_count": closed[1],
            "resume_size": closed[2],
            "drain_rate_msgs_s": _percentile(self.drain_rates, 0.5),
        }


_EMPTY: Values = np.empty(0, np.float64)


def _merged(a: Values, b: Values) -> Values:
    return a if not len(b) else b if not len(a) else np.sort(np.concatenate([a, b]), kind="stable")


def _percentile(values: Values, percentage: float) -> float | None:
    """:func:`~rabbitflow_pipeline.episodes.sorted_percentile`, the same operations in
    the same order on Python floats (so the same double)."""
    if not len(values):
        return None
    position = float(len(values) - 1) * percentage
    lower, higher = math.floor(position), math.ceil(position)
    low, high = float(values[lower]), float(values[higher])
    if higher == lower or low == high:
        return low
    return low + (position - lower) * (high - low)


def fold_episodes(episodes: pa.Table, window_end_us: int | None) -> dict[Key, QueueStats]:
    """Per queue, the statistics of ``episodes`` (Arrow, columns of :data:`_COLUMNS`);
    an open episode is overfull up to ``window_end_us``."""
    columns = {name: _values(episodes, name) for name in _COLUMNS}
    stats: dict[Key, QueueStats] = {}
    values: dict[Key, tuple[list[float], list[float]]] = {}
    for row in zip(*columns.values(), strict=True):
        (vhost, queue, start, end, duration, is_open, start_m, end_m, *thresholds) = row
        q = stats.setdefault((vhost, queue), QueueStats())
        durations, drain_rates = values.setdefault((vhost, queue), ([], []))
        q.count += 1
        until = end if end is not None else window_end_us
        if until is not None:
            q.overfull_us = (q.overfull_us or 0) + until - start
        q.open += 1 if is_open else 0
        if duration is not None:
            durations.append(duration)
            if duration > 0 and start_m is not None and end_m is not None and start_m >= end_m:
                drain_rates.append((start_m - end_m) / duration)
        q.latest = _later(q.latest, (start, thresholds[0], thresholds[1]))
        if is_open is False:
            q.latest_closed = _later(q.latest_closed, (start, thresholds[2], thresholds[3]))
    for key, q in stats.items():
        durations, drain_rates = values[key]
        q.durations = np.sort(np.array(durations, np.float64))
        q.drain_rates = np.sort(np.array(drain_rates, np.float64))
    return stats


def _values(table: pa.Table, name: str) -> list[Any]:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    values: list[Any] = column.to_pylist()
    return values


def added(a: Mapping[Key, QueueStats], b: Mapping[Key, QueueStats]) -> dict[Key, QueueStats]:
    """Each queue's statistics of ``a`` and ``b`` together."""
    both = dict(a)
    for key, stats in b.items():
        both[key] = both[key].plus(stats) if key in both else stats
    return both


#: The ``queue_stats`` schema, built once per process.
_STATS_SCHEMA: list[T.StructType] = []


def _stats_schema(spark: SparkSession) -> T.StructType:
    if not _STATS_SCHEMA:
        empty = spark.createDataFrame([], EPISODES_SCHEMA)
        _STATS_SCHEMA.append(queue_episode_stats(empty, outputs.window_frame(spark, 0, 0)).schema)
    return _STATS_SCHEMA[0]


def stats_table(stats: Mapping[Key, QueueStats], spark: SparkSession) -> pa.Table:
    """``stats`` as an Arrow table of :func:`queue_episode_stats`'s columns."""
    schema = _stats_schema(spark)
    rows = [stats[key].row(key) for key in sorted(stats, key=str)]
    types = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64()}
    arrow = pa.schema([(f.name, types[f.dataType.simpleString()]) for f in schema.fields])
    return pa.Table.from_pylist(rows, arrow)


def running_queue_stats(step: StepState, window_end_us: int | None) -> DataFrame:
    """Store the statistics with this step's settled episodes added; return the
    ``queue_stats`` table of those and its provisional ones (an open episode is
    overfull up to ``window_end_us``, the end of the observed window).

    Fetches the step's episodes from its kept intervals in one job; sets
    ``step.stats`` to the stored statistics the checkpoint names.
    """
    assert step.intervals is not None
    queue = F.col("kind") == F.lit("queue")
    episodes = step.intervals.where(queue).select(*_COLUMNS, "_final").toArrow()
    final = episodes.column("_final")
    settled, provisional = episodes.filter(final), episodes.filter(pc.invert(final))
    stored = _stored(step)
    step.stats = step.cp.stats
    if settled.num_rows or (step.cp.stats is None and stored):
        stored = added(stored, fold_episodes(settled, window_end_us))
        step.stats = f"{STATS_AREA}/v{step.batch:08d}"
        outputs.write_arrow(_state_table(stored), step.root / step.stats, _STATS_FILE)
    current = stats_table(added(stored, fold_episodes(provisional, window_end_us)), step.spark)
    return arrow_frame(step, "queue-stats", current, _stats_schema(step.spark))


_LATEST_FIELDS = ("start", "a", "b")


def _state_table(stats: Mapping[Key, QueueStats]) -> pa.Table:
    keys = sorted(stats, key=str)
    values = [stats[k] for k in keys]

    def latest(name: str, index: int) -> pa.Array:
        got = [None if getattr(s, name) is None else getattr(s, name)[index] for s in values]
        return pa.array(got, pa.int64())

    columns = {
        "vhost": pa.array([k[0] for k in keys], pa.string()),
        "queue": pa.array([k[1] for k in keys], pa.string()),
        "count": pa.array([s.count for s in values], pa.int64()),
        "overfull_us": pa.array([s.overfull_us for s in values], pa.int64()),
        "open": pa.array([s.open for s in values], pa.int64()),
        "durations": _list_array([s.durations for s in values]),
        "drain_rates": _list_array([s.drain_rates for s in values]),
    }
    for name in ("latest", "latest_closed"):
        for index, part in enumerate(_LATEST_FIELDS):
            columns[f"{name}_{part}"] = latest(name, index)
    return pa.table(columns)


def _list_array(arrays: list[Values]) -> pa.Array:
    """Arrays of doubles as one Arrow list column (no Python float per value)."""
    offsets = np.zeros(len(arrays) + 1, np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else _EMPTY
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.float64()))


def _arrays(column: pa.ChunkedArray) -> list[Values]:
    """An Arrow list column of doubles as one array per row (views of its values)."""
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy()
    flat = lists.values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(lists))]


def _from_state_table(table: pa.Table) -> dict[Key, QueueStats]:
    lists = ("durations", "drain_rates")
    c = {name: table.column(name).to_pylist() for name in table.column_names if name not in lists}
    durations, drain_rates = (_arrays(table.column(name)) for name in lists)

    def latest(name: str, i: int) -> Latest | None:
        start = c[f"{name}_start"][i]
        return None if start is None else (start, c[f"{name}_a"][i], c[f"{name}_b"][i])

    return {
        (c["vhost"][i], c["queue"][i]): QueueStats(
            c["count"][i],
            c["overfull_us"][i],
            c["open"][i],
            durations[i],
            drain_rates[i],
            latest("latest", i),
            latest("latest_closed", i),
        )
        for i in range(table.num_rows)
    }


def _stored(step: StepState) -> dict[Key, QueueStats]:
    """The statistics stored by the last step; for a checkpoint without them, its
    settled episodes' (read once)."""
    if step.cp.stats is not None:
        return _from_state_table(pq.read_table(step.root / step.cp.stats / _STATS_FILE))
    settled = [f for f in step.cp.tables.get("episodes", ()) if f.startswith("b")]
    if not settled:
        return {}
    paths = [step.out / "episodes" / f for f in settled]
    episodes = outputs.read_arrow(paths).select(list(_COLUMNS))
    # Settled episodes are closed: the window does not enter their time overfull.
    return fold_episodes(episodes, None)
