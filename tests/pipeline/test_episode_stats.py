"""The per-queue episode statistics: exact percentiles from sorted values."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rabbitflow_pipeline.episodes import queue_episode_stats, sorted_percentile
from rabbitflow_pipeline.outputs import window_frame
from rabbitflow_pipeline.schemas import EPISODES_SCHEMA
from rabbitflow_pipeline.stats_state import added, fold_episodes

PERCENTAGES = (0.0, 0.25, 0.5, 0.95, 1.0)


def test_sorted_percentile_is_sparks_exact_percentile(spark: SparkSession) -> None:
    # Groups of 1 to 60 values, with repeats (equal neighbours take the no
    # interpolation branch) and decimals that do not add up exactly in binary.
    rng = random.Random(20261128)
    rows: list[tuple[int, float | None]] = []
    for group in range(120):
        size = rng.randint(1, 60)
        pool = [round(rng.uniform(0, 300), 3) for _ in range(max(1, size // 3))]
        rows += [
            (group, rng.choice(pool) if group % 2 else round(rng.uniform(0, 300), 3))
            for _ in range(size)
        ]
    rows += [(1000, None), (1000, None)]  # only nulls: no percentile
    df = spark.createDataFrame(rows, "g int, v double")
    values = F.sort_array(F.collect_list("v"))
    got = df.groupBy("g").agg(
        F.percentile("v", F.array(*(F.lit(p) for p in PERCENTAGES))).alias("spark"),
        F.array(*(sorted_percentile(values, p) for p in PERCENTAGES)).alias("ours"),
    )
    compared = got.collect()
    assert len(compared) == 121
    for row in compared:
        if row["g"] == 1000:
            assert row["spark"] is None
            assert row["ours"] == [None] * len(PERCENTAGES)
        else:
            # Bit for bit, not approximately.
            assert row["ours"] == row["spark"], row["g"]


def _episode(
    start_s: int,
    end_s: int | None,
    stop: tuple[int, int],
    resume: tuple[int, int] | None,
    messages: tuple[int, int | None],
) -> dict[str, object]:
    """An episode of queue ``/ a``: ``stop`` and ``resume`` are (count, size) thresholds,
    ``messages`` the depth at its start and end."""
    base = dt.datetime(2026, 11, 28)
    row: dict[str, object] = dict.fromkeys(EPISODES_SCHEMA.fieldNames())
    row.update(vhost="/", queue="a", start=base + dt.timedelta(seconds=start_s), open=end_s is None)
    if end_s is not None:
        row.update(end=base + dt.timedelta(seconds=end_s), duration_s=float(end_s - start_s))
    row.update(stop_count=stop[0], stop_size=stop[1])
    if resume is not None:
        row.update(resume_count=resume[0], resume_size=resume[1])
    row.update(start_messages=messages[0], end_messages=messages[1])
    return row


def test_queue_stats_take_thresholds_from_the_latest_episodes(spark: SparkSession) -> None:
    episodes = spark.createDataFrame(
        [
            _episode(0, 10, stop=(100, 1), resume=(50, 2), messages=(100, 50)),
            _episode(20, 40, stop=(200, 3), resume=(60, 4), messages=(200, 100)),
            # Open: its stop thresholds are the latest, its resume ones are not.
            _episode(50, None, stop=(300, 5), resume=None, messages=(300, None)),
        ],
        EPISODES_SCHEMA,
    )
    base_us = int(dt.datetime(2026, 11, 28, tzinfo=dt.UTC).timestamp() * 1_000_000)
    window = window_frame(spark, base_us, base_us + 60_000_000)
    (row,) = queue_episode_stats(episodes, window).collect()
    assert row["flow_stopped_count"] == 3
    assert row["open_episodes"] == 1
    assert row["time_overfull_s"] == pytest.approx(10 + 20 + 10)
    assert (row["duration_p50_s"], row["duration_max_s"]) == (15.0, 20.0)
    assert row["duration_p95_s"] == pytest.approx(19.5)
    assert (row["stop_count"], row["stop_size"]) == (300, 5)
    assert (row["resume_count"], row["resume_size"]) == (60, 4)
    # Drain rates 5.0 and 5.0 msg/s.
    assert row["drain_rate_msgs_s"] == 5.0


def test_the_steps_running_statistics_are_sparks_to_the_last_bit(spark: SparkSession) -> None:
    """The statistics an incremental step keeps per queue and adds up in the driver,
    over episodes cut into parts (as steps add their settled episodes, then their
    provisional ones), are :func:`queue_episode_stats` over all of them, exactly."""
    rng = random.Random(20261129)
    rows = []
    for queue in "abcdef":
        start = 0
        for _ in range(rng.randint(1, 40)):
            start += rng.randint(0, 30)  # equal starts: the thresholds' order decides
            length = None if queue == "f" else rng.choice([None, 0, *range(1, 20)])
            end = None if length is None else start + length
            messages = (rng.randint(0, 500), None if end is None else rng.randint(0, 500))
            stop = (rng.randint(1, 9), rng.choice([None, 1, 2]))
            row = _episode(start, end, stop=stop, resume=(2, rng.randint(1, 3)), messages=messages)
            if end is not None:  # durations that do not add up exactly in binary
                row["duration_s"] = (length or 0) + rng.choice([0.0, 0.1, 0.333])
            rows.append({**row, "queue": queue})
    rng.shuffle(rows)
    base_us = int(dt.datetime(2026, 11, 28, tzinfo=dt.UTC).timestamp() * 1_000_000)
    end_us = base_us + 2_000_000_000
    window = window_frame(spark, base_us, end_us)
    expected = queue_episode_stats(spark.createDataFrame(rows, EPISODES_SCHEMA), window)

    cuts = sorted(rng.sample(range(1, len(rows)), 3))
    stats: dict = {}
    for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        part = spark.createDataFrame(rows[a:b], EPISODES_SCHEMA).toArrow()
        stats = added(stats, fold_episodes(part, end_us))
    got = sorted(tuple(stats[key].row(key).values()) for key in stats)
    want = sorted(tuple(r) for r in expected.collect())
    assert len(want) == 6
    assert got == want  # floats compared exactly
