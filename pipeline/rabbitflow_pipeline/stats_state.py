"""The incremental step's per-queue episode statistics, kept as a running state.

A settled episode never changes (see :mod:`rabbitflow_pipeline.settling`),
so each step adds its settled episodes' :func:`episode_partials` to the
stored ones (``_state/stats/vN``: one row per queue, its counts, sums,
sorted durations and drain rates, latest thresholds) and computes the
``queue_stats`` the summary and advice read from that and the step's
provisional episodes.  The numbers are those of
:func:`~rabbitflow_pipeline.episodes.queue_episode_stats` over every
episode stored, to the last bit, without reading the ``episodes`` table.

A checkpoint written before this state existed has none: its settled
episodes are then read once, and the state starts from them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from rabbitflow_pipeline.episodes import (
    episode_partials,
    episodes_from,
    merge_partials,
    stats_from_partials,
)
from rabbitflow_pipeline.schemas import EPISODES_SCHEMA
from rabbitflow_pipeline.settling import StepState, final_rows, provisional_rows

__all__ = ["STATS_AREA", "running_queue_stats"]

#: The ``_state`` area of the stored statistics.
STATS_AREA = "stats"

#: The schema of :func:`episode_partials` rows, built once per process.
_PARTIALS_SCHEMA: list[T.StructType] = []


def _partials_schema(spark: SparkSession) -> T.StructType:
    if not _PARTIALS_SCHEMA:
        _PARTIALS_SCHEMA.append(episode_partials(spark.createDataFrame([], EPISODES_SCHEMA)).schema)
    return _PARTIALS_SCHEMA[0]


def running_queue_stats(step: StepState) -> DataFrame:
    """Store the statistics with this step's settled episodes added (when it has any);
    return the ``queue_stats`` table, those and its provisional episodes', kept.

    Sets ``step.stats`` to the stored statistics the checkpoint names.
    """
    assert step.window is not None
    assert step.step_counts is not None
    spark = step.spark
    schema = _partials_schema(spark)
    stored = _stored(step, schema)
    step.stats = step.cp.stats
    if int(step.step_counts["final_episodes"]) or (step.cp.stats is None and stored is not None):
        settled = episode_partials(episodes_from(final_rows(step)), step.window)
        merged = settled if stored is None else merge_partials(stored.unionByName(settled))
        step.stats = f"{STATS_AREA}/v{step.batch:08d}"
        path = str(step.root / step.stats)
        # One file (a row per queue): the merge's last stage in one task.
        merged.coalesce(1).write.mode("overwrite").parquet(path)
        stored = spark.read.schema(schema).parquet(path)
    provisional = episode_partials(episodes_from(provisional_rows(step)), step.window)
    parts = provisional if stored is None else stored.unionByName(provisional)
    return step.kept.keep(stats_from_partials(merge_partials(parts)))


def _stored(step: StepState, schema: T.StructType) -> DataFrame | None:
    """The statistics stored by the last step; for a checkpoint without them, its
    settled episodes' (read once); None when there is nothing stored."""
    spark = step.spark
    if step.cp.stats is not None:
        return spark.read.schema(schema).parquet(str(step.root / step.cp.stats))
    settled = [f for f in step.cp.tables.get("episodes", ()) if f.startswith("b")]
    if not settled:
        return None
    assert step.window is not None
    episodes = spark.read.schema(EPISODES_SCHEMA).parquet(
        *(str(step.out / "episodes" / f) for f in settled)
    )
    return episode_partials(episodes, step.window)
