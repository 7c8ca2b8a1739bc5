"""Pairing partitioned by the key hash alone, runs of repeated opens, observed histograms."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from rabbitflow_pipeline.batch import TABLES, analyze
from rabbitflow_pipeline.blocks import channel_blocks
from rabbitflow_pipeline.episodes import episodes_from, observed_window, queue_episodes
from rabbitflow_pipeline.histograms import duration_histogram, histogram_metrics, histogram_rows
from rabbitflow_pipeline.inputs import parse_event_lines, valid_events
from rabbitflow_pipeline.pairing import (
    DUPLICATE_WINDOW_S,
    KEY_COLLISIONS_METRIC,
    finish_intervals,
    flow_intervals,
    pair_candidates,
    resolve_runs,
)
from rabbitflow_pipeline.schemas import ALL_QUEUES, EPISODES_SCHEMA
from rabbitflow_pipeline.summary import queue_summary

from .logs import (
    GW_A,
    GW_B,
    at,
    enforced,
    ignored,
    line,
    lines_df,
    over,
    removed,
    store_over,
    store_under,
    under,
)

pytestmark = pytest.mark.spark


def colliding_hash(*columns: Column) -> Column:
    """Every key hashes alike: the worst case a 64-bit hash could produce."""
    return F.lit(7).cast("long")


def mixed_log(spark: SparkSession) -> DataFrame:
    """Every kind of event, two gateways, interleaved keys, repeats and a malformed line."""
    return parse_event_lines(
        lines_df(
            spark,
            [
                (GW_A, line(under(1, "a"))),  # stray close: ignored
                (GW_A, line(over(2, "a"))),
                (GW_A, line(enforced(3, 7, 1, "a"))),
                (GW_A, line(over(4, "a", messages=950))),  # repeated open
                (GW_A, line(over(5, "b"))),
                (GW_A, line(over(6, "a", messages=990))),  # repeated again
                (GW_A, "{not json"),
                (GW_A, line(under(9, "a", messages=400))),
                (GW_A, line(removed(9, 7, 1))),
                (GW_A, line(under(10, "a"))),  # stray close
                (GW_A, line(store_over(11))),
                (GW_B, line(enforced(3, 7, 1, ALL_QUEUES))),  # same channel, other gateway
                (GW_B, line(under(12, "b", messages=300))),
                (GW_B, line(ignored(13, 7, 1))),
                (GW_B, line(over(14, "a"))),
                (GW_B, line(over(15, "a"))),  # a run left open at the end
                (GW_A, line(store_under(16))),
                (GW_A, line(enforced(17, 7, 1, "a"))),
            ],
        )
    )


def sorted_rows(df: DataFrame) -> list[tuple[object, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_hash_partitioned_pairing_equals_the_exact_one(spark: SparkSession) -> None:
    parsed = mixed_log(spark)
    collisions = Observation("keys")
    fast = flow_intervals(parsed, collisions=collisions)
    assert sorted_rows(fast) == sorted_rows(flow_intervals(parsed))
    assert collisions.get == {KEY_COLLISIONS_METRIC: 0}


def test_a_run_of_repeated_opens_keeps_its_first_numbers_and_ends_at_the_next_close(
    spark: SparkSession,
) -> None:
    episodes = episodes_from(flow_intervals(mixed_log(spark), collisions=Observation()))
    expected = spark.createDataFrame(
        [
            ("/", "a", at(2), at(9), 7.0, False, 901, 9010, 900, 0, 400, 4990, 500, 0),
            ("/", "b", at(5), at(12), 7.0, False, 901, 9010, 900, 0, 300, 4990, 500, 0),
            ("/", "a", at(14), None, None, True, 901, 9010, 900, 0, None, None, None, None),
        ],
        EPISODES_SCHEMA,
    )
    assertDataFrameEqual(episodes, expected)


def test_colliding_hashes_are_counted_and_the_exact_pairing_still_holds(
    spark: SparkSession,
) -> None:
    parsed = mixed_log(spark)
    collisions = Observation("keys")
    flow_intervals(parsed, collisions=collisions, key_hash=colliding_hash).count()
    assert collisions.get[KEY_COLLISIONS_METRIC] > 0
    assert sorted_rows(flow_intervals(parsed, key_hash=colliding_hash)) == sorted_rows(
        flow_intervals(parsed)
    )


def test_analyze_pairs_again_when_hashes_collide(spark: SparkSession, tmp_path: Path) -> None:
    log = tmp_path / "gw.jsonl"
    log.write_text(
        "\n".join(
            line(e)
            for e in [
                over(0, "a"),
                enforced(1, 7, 1, "a"),
                over(2, "b"),
                removed(5, 7, 1),
                under(6, "a"),
                under(8, "b"),
                over(9, "a"),
            ]
        )
        + "\n"
    )
    normal = analyze(spark, [str(log)], tmp_path / "normal")
    collided = analyze(spark, [str(log)], tmp_path / "collided", key_hash=colliding_hash)
    assert (collided.events, collided.episodes) == (normal.events, normal.episodes) == (7, 3)
    for table in TABLES:
        assertDataFrameEqual(
            spark.read.parquet(str(tmp_path / "collided" / table)),
            spark.read.parquet(str(tmp_path / "normal" / table)),
        )


def test_observed_histogram_equals_the_histogram_table(spark: SparkSession) -> None:
    df = spark.createDataFrame([(0.5,), (1.0,), (4.9,), (100.0,), (None,), (-1.0,)], "d double")
    edges = (0, 1, 5)
    observed = Observation("h")
    df.observe(observed, *histogram_metrics(F.col("d"), "d", edges)).count()
    assert histogram_rows(observed.get, "d", edges) == [
        row.asDict() for row in duration_histogram(df, "d", edges).orderBy("bucket").collect()
    ]


def test_histogram_metrics_refuse_unordered_edges() -> None:
    with pytest.raises(ValueError, match="increasing"):
        histogram_metrics(F.col("d"), "d", (1, 1))


def test_time_overfull_is_summed_exactly(spark: SparkSession) -> None:
    # 0.1 s + 0.2 s: a sum of doubles gives 0.30000000000000004.
    events = valid_events(
        parse_event_lines(
            lines_df(
                spark,
                [
                    (GW_A, line(over(0, "a"))),
                    (GW_A, line(under(0.1, "a"))),
                    (GW_A, line(over(1, "a"))),
                    (GW_A, line(under(1.2, "a"))),
                ],
            )
        )
    )
    summary = queue_summary(queue_episodes(events), channel_blocks(events), observed_window(events))
    assert summary.select("time_overfull_s").collect()[0][0] == 0.3


def test_runs_resolved_apart_give_the_same_intervals(spark: SparkSession) -> None:
    candidates = pair_candidates(mixed_log(spark), collisions=Observation("keys"))
    kept = candidates.localCheckpoint(eager=True)
    resolved = resolve_runs(kept).localCheckpoint(eager=True)
    # Two runs of repeated opens: queue a at 2, 4, 6 and at 14, 15.
    assert resolved.count() == 2
    assert sorted_rows(finish_intervals(kept, resolved)) == sorted_rows(
        flow_intervals(mixed_log(spark))
    )


def member(event_line: str, gateway: str) -> str:
    """``event_line`` as a member of a gateway cluster logs it (with its ``gateway`` field)."""
    return line_with(event_line, gateway=gateway)


def line_with(event_line: str, **fields: object) -> str:
    import json

    return json.dumps({**json.loads(event_line), **fields})


def episode_bounds(spark: SparkSession, rows: list[tuple[str, str]]) -> list[tuple[float, float]]:
    episodes = queue_episodes(parse_event_lines(lines_df(spark, rows))).orderBy("start")
    zero = at(0).replace(tzinfo=None)
    return [
        ((r["start"] - zero).total_seconds(), (r["end"] - zero).total_seconds())
        for r in episodes.collect()
    ]


def test_a_transition_two_members_logged_is_one(spark: SparkSession) -> None:
    # A short episode that member b logs 0.5 s after member a: its QUE-1003
    # copy comes after a's QUE-1004, so the pairing rules alone would open a
    # second episode from it.
    rows = [
        (GW_A, member(line(over(0, "orders")), "a")),
        (GW_A, member(line(under(0.2, "orders")), "a")),
        (GW_B, member(line(over(0.5, "orders")), "b")),
        (GW_B, member(line(under(0.7, "orders")), "b")),
        # A real new episode, decided by b after the duplicate window.
        (GW_B, member(line(over(10, "orders")), "b")),
        (GW_B, member(line(under(12, "orders")), "b")),
    ]
    assert episode_bounds(spark, rows) == [(0.0, 0.2), (10.0, 12.0)]


def test_only_another_member_within_the_window_makes_a_duplicate(spark: SparkSession) -> None:
    rows = [
        # The same member twice (a restart re-announcing): the pairing rules apply.
        (GW_A, member(line(over(0, "a")), "m1")),
        (GW_A, member(line(under(0.1, "a")), "m1")),
        (GW_A, member(line(over(0.2, "a")), "m1")),
        (GW_A, member(line(under(0.3, "a")), "m1")),
        # Another member, but later than the window: a transition of its own.
        (GW_B, member(line(over(5, "b")), "m1")),
        (GW_B, member(line(under(5.1, "b")), "m1")),
        (GW_B, member(line(over(5 + DUPLICATE_WINDOW_S + 1, "b")), "m2")),
        (GW_B, member(line(under(5 + DUPLICATE_WINDOW_S + 2, "b")), "m2")),
        # No gateway field (one gateway, or Broker-J): never a duplicate.
        (GW_A, line(over(20, "c"))),
        (GW_A, line(under(20.1, "c"))),
        (GW_B, line(over(20.2, "c"))),
        (GW_B, line(under(20.3, "c"))),
    ]
    window = DUPLICATE_WINDOW_S
    assert episode_bounds(spark, rows) == [
        (0.0, 0.1),
        (0.2, 0.3),
        (5.0, 5.1),
        (6.0 + window, 7.0 + window),
        (20.0, 20.1),
        (20.2, 20.3),
    ]
