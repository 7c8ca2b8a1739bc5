"""Every transform on small hand-written logs, with exact expected tables."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from rabbitflow_broker.events import record_fields
from rabbitflow_pipeline.advice import RESUME_RULES, STOP_RULES, advice_rules
from rabbitflow_pipeline.advice_text import TEMPLATES, advice_table, render
from rabbitflow_pipeline.blocks import channel_blocks
from rabbitflow_pipeline.delays import send_delays
from rabbitflow_pipeline.episodes import (
    episode_timeline,
    observed_window,
    queue_episode_stats,
    queue_episodes,
)
from rabbitflow_pipeline.histograms import duration_histogram
from rabbitflow_pipeline.inputs import (
    client_flow_records,
    delay_seconds,
    parse_client_lines,
    parse_event_lines,
    valid_events,
)
from rabbitflow_pipeline.malformed import malformed_from, malformed_summary
from rabbitflow_pipeline.pairing import flow_intervals
from rabbitflow_pipeline.schemas import (
    ALL_QUEUES,
    CHANNEL_BLOCKS_SCHEMA,
    EPISODES_SCHEMA,
    EVENT_RECORD_SCHEMA,
    QUEUE_LIMITS_SCHEMA,
    STORE_EPISODES_SCHEMA,
)
from rabbitflow_pipeline.store import store_episodes
from rabbitflow_pipeline.summary import queue_summary

from .logs import (
    GW_A,
    GW_B,
    at,
    channel_closed,
    client_line,
    connection_closed,
    enforced,
    gateway_log,
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


def events_of(spark: SparkSession, *events, source: str = GW_A) -> DataFrame:  # type: ignore[no-untyped-def]
    return valid_events(parse_event_lines(gateway_log(spark, *events, source=source)))


def episode(
    vhost,
    queue,
    start,
    end,
    *,
    start_messages=901,
    start_size=9010,
    stop_count=900,  # type: ignore[no-untyped-def]
    stop_size=0,
    end_messages=499,
    end_size=4990,
    resume_count=500,
    resume_size=0,
):
    closed = end is not None
    return (
        vhost,
        queue,
        at(start),
        at(end) if closed else None,
        float(end - start) if closed else None,
        not closed,
        start_messages,
        start_size,
        stop_count,
        stop_size,
        end_messages if closed else None,
        end_size if closed else None,
        resume_count if closed else None,
        resume_size if closed else None,
    )


# --- schemas -------------------------------------------------------------------------------


def test_event_schema_has_every_record_field_of_the_gateway() -> None:
    # Then the optional ones the gateway does not write yet (the cluster member's name).
    assert EVENT_RECORD_SCHEMA.fieldNames() == [*record_fields(), "gateway"]


# --- parsing and malformed lines -----------------------------------------------------------


def test_parse_event_lines_types_a_good_event(spark: SparkSession) -> None:
    events = events_of(spark, over(1.5, "orders"))
    row = events.select("ts", "code", "vhost", "queue", "messages", "message_capacity").collect()
    assert [tuple(r) for r in row] == [
        (at(1.5).replace(tzinfo=None), "QUE-1003", "/", "orders", 901, 900)
    ]


def test_parse_event_lines_names_the_reason_of_each_malformed_line(spark: SparkSession) -> None:
    good = json.loads(line(over(1, "orders")))
    # Neither the field nor the subject says which queue.
    no_queue = {k: v for k, v in good.items() if k not in ("queue", "subject")}
    rows = [
        (GW_A, "{not json"),
        (GW_A, json.dumps({k: v for k, v in good.items() if k != "ts"})),
        (GW_A, json.dumps({k: v for k, v in good.items() if k != "code"})),
        (GW_A, json.dumps({**good, "code": "QUE-9999"})),
        (GW_A, json.dumps({**good, "ts": "yesterday"})),
        (GW_A, json.dumps(no_queue)),
        (GW_A, "   "),
        (GW_A, json.dumps(good)),
    ]
    parsed = parse_event_lines(lines_df(spark, rows))
    assertDataFrameEqual(
        parsed.select("malformed_reason"),
        [
            (r,)
            for r in [
                "bad_json",
                "missing_ts",
                "missing_code",
                "unknown_code",
                "bad_ts",
                "missing_field",
                None,
            ]
        ],
    )


def test_parse_event_lines_flags_a_field_of_the_wrong_type(spark: SparkSession) -> None:
    bad = {**json.loads(line(over(1, "orders"))), "messages": "many"}
    parsed = parse_event_lines(lines_df(spark, [(GW_A, json.dumps(bad))]))
    assertDataFrameEqual(parsed.select("malformed_reason"), [("bad_field",)])


def test_flow_intervals_pass_malformed_lines_through_with_their_reason(
    spark: SparkSession,
) -> None:
    parsed = parse_event_lines(
        lines_df(
            spark,
            [(GW_A, line(over(1, "q"))), (GW_A, "{"), (GW_B, "{"), (GW_B, line(under(2, "q")))],
        )
    )
    intervals = flow_intervals(parsed)
    assertDataFrameEqual(
        intervals.select("kind", "source", "reason", "open"),
        [
            ("queue", GW_A, None, False),
            ("malformed", GW_A, "bad_json", True),
            ("malformed", GW_B, "bad_json", True),
        ],
    )
    assertDataFrameEqual(
        malformed_from(intervals),
        [("gateway", GW_A, "bad_json", 1), ("gateway", GW_B, "bad_json", 1)],
    )


def test_malformed_summary_counts_per_log_source_and_reason(spark: SparkSession) -> None:
    events = parse_event_lines(
        lines_df(
            spark,
            [
                (GW_A, "{"),
                (GW_A, "[1]"),
                (GW_B, '{"code": "QUE-1003"}'),
                (GW_B, line(over(1, "q"))),
            ],
        )
    )
    client = parse_client_lines(
        lines_df(
            spark,
            [
                ("c.log", "oops"),
                ("c.log", '{"event": "hello"}'),
                ("c.log", client_line(1, "send_delayed", waited_ms=5000)),
            ],
        )
    )
    assertDataFrameEqual(
        malformed_summary(events, client),
        [
            ("gateway", GW_A, "bad_json", 1),
            # Not a JSON object, so read as a text line, which has no leading timestamp.
            ("gateway", GW_A, "no_timestamp", 1),
            ("gateway", GW_B, "missing_ts", 1),
            ("client", "c.log", "bad_json", 1),
        ],
    )


def test_parse_client_lines_ignores_other_records_and_flags_bad_ones(spark: SparkSession) -> None:
    rows = [
        ("c", '{"timestamp": "2026-11-22T05:00:00Z", "logger": "app", "event": "started"}'),
        ("c", client_line(1, "send_delayed", waited_ms=5000)),
        ("c", client_line(2, "send_delayed")),
        ("c", client_line(3, "exploded")),
        ("c", '{"timestamp": 12, "flow_event": "send_failed"'),
    ]
    parsed = parse_client_lines(lines_df(spark, rows))
    assertDataFrameEqual(
        parsed.select("malformed_reason"),
        [("ignored",), (None,), ("missing_waited_ms",), ("unknown_flow_event",), ("bad_json",)],
    )


def test_delay_seconds_is_the_wait_of_good_delay_and_timeout_records_only(
    spark: SparkSession,
) -> None:
    rows = [
        ("c", client_line(1, "send_delayed", waited_ms=5000)),
        ("c", client_line(2, "send_failed", waited_ms=60000)),
        ("c", client_line(3, "flow_enforced", waited_ms=7000)),
        ("c", client_line(4, "send_delayed")),
        ("c", '{"timestamp": "later", "flow_event": "send_delayed", "waited_ms": 9000}'),
        ("c", '{"timestamp": "2026-11-22T05:00:00Z", "logger": "app", "event": "started"}'),
    ]
    parsed = parse_client_lines(lines_df(spark, rows))
    assertDataFrameEqual(
        parsed.select(delay_seconds().alias("s")),
        [(5.0,), (60.0,), (None,), (None,), (None,), (None,)],
    )


def test_parse_client_lines_reads_microsecond_structlog_timestamps(spark: SparkSession) -> None:
    text = client_line(0, "flow_enforced").replace(
        "2026-11-22T05:00:00.000Z", "2026-11-22T05:00:00.123456Z"
    )
    records = client_flow_records(parse_client_lines(lines_df(spark, [("c", text)])))
    assert records.collect()[0]["timestamp"] == at(0.123456).replace(tzinfo=None)


# --- queue episodes ------------------------------------------------------------------------


def test_queue_episode_runs_from_overfull_to_underfull_with_both_events_numbers(
    spark: SparkSession,
) -> None:
    events = events_of(
        spark,
        over(10, "orders", messages=950, size=95_000),
        under(25.5, "orders", messages=480, size=48_000),
    )
    expected = spark.createDataFrame(
        [
            episode(
                "/",
                "orders",
                10,
                25.5,
                start_messages=950,
                start_size=95_000,
                end_messages=480,
                end_size=48_000,
            )
        ],
        EPISODES_SCHEMA,
    )
    assertDataFrameEqual(queue_episodes(events), expected)


def test_queue_episode_without_underfull_is_open_with_null_end(spark: SparkSession) -> None:
    events = events_of(spark, over(10, "orders"), under(20, "orders"), over(30, "orders"))
    expected = spark.createDataFrame(
        [episode("/", "orders", 10, 20), episode("/", "orders", 30, None)], EPISODES_SCHEMA
    )
    assertDataFrameEqual(queue_episodes(events), expected)


def test_repeated_overfull_before_underfull_opens_one_episode(spark: SparkSession) -> None:
    events = events_of(
        spark,
        over(10, "orders"),
        over(12, "orders", messages=905),
        under(20, "orders"),
        under(21, "orders"),
    )
    expected = spark.createDataFrame([episode("/", "orders", 10, 20)], EPISODES_SCHEMA)
    assertDataFrameEqual(queue_episodes(events), expected)


def test_underfull_with_no_open_episode_is_ignored(spark: SparkSession) -> None:
    events = events_of(spark, under(5, "orders"), over(10, "orders"), under(20, "orders"))
    expected = spark.createDataFrame([episode("/", "orders", 10, 20)], EPISODES_SCHEMA)
    assertDataFrameEqual(queue_episodes(events), expected)


def test_overlapping_episodes_on_different_queues_stay_apart(spark: SparkSession) -> None:
    events = events_of(
        spark,
        over(10, "a"),
        over(12, "b"),
        over(13, "a", vhost="other"),
        under(15, "a"),
        under(30, "b"),
        under(40, "a", vhost="other"),
    )
    expected = spark.createDataFrame(
        [episode("/", "a", 10, 15), episode("/", "b", 12, 30), episode("other", "a", 13, 40)],
        EPISODES_SCHEMA,
    )
    assertDataFrameEqual(queue_episodes(events), expected)


def test_events_out_of_order_across_files_are_paired_by_timestamp(spark: SparkSession) -> None:
    # gw-b's file is read first but holds the later events of the same queue.
    lines = lines_df(
        spark,
        [
            (GW_B, line(over(100, "orders"))),
            (GW_B, line(under(110, "orders"))),
            (GW_A, line(under(50, "orders"))),
            (GW_A, line(over(40, "orders"))),
        ],
    )
    events = valid_events(parse_event_lines(lines))
    expected = spark.createDataFrame(
        [episode("/", "orders", 40, 50), episode("/", "orders", 100, 110)], EPISODES_SCHEMA
    )
    assertDataFrameEqual(queue_episodes(events), expected)


def test_malformed_lines_between_events_do_not_break_an_episode(spark: SparkSession) -> None:
    lines = lines_df(
        spark,
        [
            (GW_A, line(over(10, "orders"))),
            (GW_A, "{garbage"),
            (GW_A, '{"ts": "2026-11-22T05:00:12Z", "code": "QUE-1004"}'),
            (GW_A, line(under(20, "orders"))),
        ],
    )
    events = valid_events(parse_event_lines(lines))
    expected = spark.createDataFrame([episode("/", "orders", 10, 20)], EPISODES_SCHEMA)
    assertDataFrameEqual(queue_episodes(events), expected)


# --- channel blocks ------------------------------------------------------------------------


def block(connection, channel, queue, start, end, *, closed_by, source=GW_A):  # type: ignore[no-untyped-def]
    closed = end is not None
    return (
        connection,
        channel,
        queue,
        at(start),
        at(end) if closed else None,
        float(end - start) if closed else None,
        not closed,
        closed_by,
        "/",
        "guest",
        "10.0.0.5:50514",
        source,
    )


def test_channel_block_runs_from_enforced_to_removed_or_ignored(spark: SparkSession) -> None:
    events = events_of(
        spark,
        enforced(1, 7, 1, "orders"),
        enforced(2, 7, 2, "orders"),
        removed(4, 7, 1),
        ignored(7, 7, 2),
        enforced(9, 8, 1, ALL_QUEUES),
    )
    expected = spark.createDataFrame(
        [
            block(7, 1, "orders", 1, 4, closed_by="CHN-1006"),
            block(7, 2, "orders", 2, 7, closed_by="CHN-1012"),
            block(8, 1, ALL_QUEUES, 9, None, closed_by=None),
        ],
        CHANNEL_BLOCKS_SCHEMA,
    )
    assertDataFrameEqual(channel_blocks(events), expected)


def test_same_connection_number_from_two_gateways_does_not_merge(spark: SparkSession) -> None:
    a = gateway_log(spark, enforced(1, 7, 1, "orders"), removed(3, 7, 1), source=GW_A)
    b = gateway_log(spark, enforced(2, 7, 1, "orders"), removed(6, 7, 1), source=GW_B)
    events = valid_events(parse_event_lines(a.unionByName(b)))
    expected = spark.createDataFrame(
        [
            block(7, 1, "orders", 1, 3, closed_by="CHN-1006", source=GW_A),
            block(7, 1, "orders", 2, 6, closed_by="CHN-1006", source=GW_B),
        ],
        CHANNEL_BLOCKS_SCHEMA,
    )
    assertDataFrameEqual(channel_blocks(events), expected)


def blocks_of(spark: SparkSession, *rows: tuple[str, str]) -> DataFrame:
    """Channel blocks of (source, line) rows in that order."""
    return channel_blocks(valid_events(parse_event_lines(lines_df(spark, list(rows)))))


def test_channel_close_ends_its_open_block(spark: SparkSession) -> None:
    blocks = blocks_of(
        spark, (GW_A, line(enforced(1, 7, 1, "orders"))), (GW_A, channel_closed(5, 7, 1))
    )
    expected = spark.createDataFrame(
        [block(7, 1, "orders", 1, 5, closed_by="CHN-1003")], CHANNEL_BLOCKS_SCHEMA
    )
    assertDataFrameEqual(blocks, expected)


def test_connection_close_ends_every_open_block_of_that_connection_only(
    spark: SparkSession,
) -> None:
    blocks = blocks_of(
        spark,
        (GW_A, line(enforced(1, 7, 1, "orders"))),
        (GW_A, line(enforced(2, 7, 2, "orders"))),
        (GW_A, line(enforced(3, 8, 1, "orders"))),
        (GW_B, line(enforced(3, 7, 1, "orders"))),
        (GW_A, connection_closed(6, 7)),
    )
    expected = spark.createDataFrame(
        [
            block(7, 1, "orders", 1, 6, closed_by="CON-1002"),
            block(7, 2, "orders", 2, 6, closed_by="CON-1002"),
            block(8, 1, "orders", 3, None, closed_by=None),
            block(7, 1, "orders", 3, None, closed_by=None, source=GW_B),
        ],
        CHANNEL_BLOCKS_SCHEMA,
    )
    assertDataFrameEqual(blocks, expected)


def test_block_ends_at_whichever_close_comes_first(spark: SparkSession) -> None:
    blocks = blocks_of(
        spark,
        (GW_A, line(enforced(1, 7, 1, "orders"))),
        (GW_A, line(enforced(1, 7, 2, "orders"))),
        (GW_A, channel_closed(4, 7, 1)),
        (GW_A, line(removed(8, 7, 2))),
        (GW_A, connection_closed(6, 7)),
    )
    expected = spark.createDataFrame(
        [
            block(7, 1, "orders", 1, 4, closed_by="CHN-1003"),
            block(7, 2, "orders", 1, 6, closed_by="CON-1002"),
        ],
        CHANNEL_BLOCKS_SCHEMA,
    )
    assertDataFrameEqual(blocks, expected)


def test_connection_close_before_a_block_does_not_end_it(spark: SparkSession) -> None:
    blocks = blocks_of(
        spark, (GW_A, connection_closed(1, 7)), (GW_A, line(enforced(2, 7, 1, "orders")))
    )
    expected = spark.createDataFrame(
        [block(7, 1, "orders", 2, None, closed_by=None)], CHANNEL_BLOCKS_SCHEMA
    )
    assertDataFrameEqual(blocks, expected)


def test_channel_close_with_nothing_open_makes_no_block(spark: SparkSession) -> None:
    blocks = blocks_of(
        spark,
        (GW_A, line(enforced(1, 7, 1, "orders"))),
        (GW_A, line(removed(2, 7, 1))),
        (GW_A, channel_closed(3, 7, 1)),
        (GW_A, connection_closed(4, 7)),
    )
    expected = spark.createDataFrame(
        [block(7, 1, "orders", 1, 2, closed_by="CHN-1006")], CHANNEL_BLOCKS_SCHEMA
    )
    assertDataFrameEqual(blocks, expected)


# --- store episodes ------------------------------------------------------------------------


def test_store_episode_runs_from_overfull_to_cleared_per_vhost(spark: SparkSession) -> None:
    events = events_of(spark, store_over(10), store_over(11, "v2"), store_under(40))
    expected = spark.createDataFrame(
        [
            ("/", at(10), at(40), 30.0, False, "RabbitMQ", 2000, 1500, 1000, 900),
            ("v2", at(11), None, None, True, "RabbitMQ", 2000, 1500, 1000, None),
        ],
        STORE_EPISODES_SCHEMA,
    )
    assertDataFrameEqual(store_episodes(events), expected)


# --- summary -------------------------------------------------------------------------------


def test_observed_window_spans_all_events(spark: SparkSession) -> None:
    events = events_of(spark, over(10, "a"), removed(110, 1, 1), store_over(60))
    assertDataFrameEqual(
        observed_window(events),
        [(at(10).replace(tzinfo=None), at(110).replace(tzinfo=None), 100.0)],
    )


def test_queue_summary_counts_stops_time_overfull_and_channels(spark: SparkSession) -> None:
    events = events_of(
        spark,
        over(0, "a"),
        enforced(1, 7, 1, "a"),
        enforced(1, 7, 2, "a"),
        under(10, "a"),
        removed(10, 7, 1),
        removed(10, 7, 2),
        over(20, "a"),
        enforced(21, 7, 1, "a"),
        under(50, "a"),
        removed(50, 7, 1),
        over(90, "a"),
        enforced(95, 9, 1, "b"),
        enforced(96, 10, 1, ALL_QUEUES),
        removed(100, 9, 1),
    )
    summary = queue_summary(queue_episodes(events), channel_blocks(events), observed_window(events))
    # a: episodes 10s, 30s and one open from 90 to the window end (100): 50s of 100s.
    assertDataFrameEqual(
        summary,
        [
            ("/", "a", 3, 50.0, 50.0, 1, 20.0, 29.0, 30.0, 2, 3),
            ("/", "b", 0, 0.0, 0.0, 0, None, None, None, 1, 1),
        ],
    )


# --- client send delays --------------------------------------------------------------------


def test_send_delays_per_producer_and_destination(spark: SparkSession) -> None:
    rows = [
        ("c", client_line(0, "flow_enforced")),
        ("c", client_line(5, "send_delayed", waited_ms=5000)),
        ("c", client_line(10, "send_delayed", waited_ms=10000)),
        ("c", client_line(60, "send_failed", waited_ms=60000)),
        ("c", client_line(70, "send_delayed", producer="p-2", waited_ms=5000, capacity=50)),
    ]
    client = client_flow_records(parse_client_lines(lines_df(spark, rows)))
    assertDataFrameEqual(
        send_delays(client),
        [
            (
                "p-1",
                "queue://orders",
                60000,
                2,
                1,
                1,
                100,
                at(0).replace(tzinfo=None),
                at(60).replace(tzinfo=None),
            ),
            (
                "p-2",
                "queue://orders",
                5000,
                1,
                0,
                0,
                50,
                at(70).replace(tzinfo=None),
                at(70).replace(tzinfo=None),
            ),
        ],
    )


# --- histogram and timeline ----------------------------------------------------------------


def test_duration_histogram_counts_every_bucket(spark: SparkSession) -> None:
    df = spark.createDataFrame([(0.5,), (1.0,), (4.9,), (100.0,), (None,)], "d double")
    assertDataFrameEqual(
        duration_histogram(df, "d", (0, 1, 5)),
        [(0, 0.0, 1.0, 1), (1, 1.0, 5.0, 2), (2, 5.0, None, 1)],
    )


def test_duration_histogram_refuses_unordered_edges(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1.0,)], "d double")
    with pytest.raises(ValueError, match="increasing"):
        duration_histogram(df, "d", (0, 5, 5))


def test_episode_timeline_spreads_overfull_time_over_buckets(spark: SparkSession) -> None:
    events = events_of(
        spark,
        over(0, "a"),
        under(15, "a"),
        over(35, "a"),
        over(5, "b"),
        under(10, "b"),
        removed(40, 1, 1),
    )
    episodes = queue_episodes(events)
    queues = spark.createDataFrame([("/", "a")], "vhost string, queue string")
    timeline = episode_timeline(episodes, observed_window(events), queues, buckets=4)
    # 40s window in 10s buckets: a is overfull 0-15 and 35-40 (open to the window end).
    assertDataFrameEqual(
        timeline,
        [("/", "a", 0, 10.0, 10.0), ("/", "a", 1, 5.0, 10.0), ("/", "a", 3, 5.0, 10.0)],
    )


# --- advice --------------------------------------------------------------------------------


def _advice(
    spark: SparkSession,
    client_rows: list[str] | None,
    limits: list[tuple[str, str, int | None, int | None]] | None,
) -> dict[str, object]:
    # One closed episode: 900 -> 500 resume, drained 901 -> 499 in 40s (10.05 msg/s).
    events = events_of(spark, over(0, "orders"), under(40, "orders"))
    delays = None
    if client_rows is not None:
        delays = send_delays(
            client_flow_records(
                parse_client_lines(lines_df(spark, [("c", r) for r in client_rows]))
            )
        )
    limits_df = None if limits is None else spark.createDataFrame(limits, QUEUE_LIMITS_SCHEMA)
    rules = advice_rules(queue_episode_stats(queue_episodes(events)), delays, limits_df)
    rows = advice_table(rules).collect()
    assert len(rows) == 1
    return rows[0].asDict()


def test_advice_accepts_stop_plus_capacities_under_the_maximum(spark: SparkSession) -> None:
    row = _advice(
        spark,
        [
            client_line(1, "flow_enforced", producer="p-1", capacity=50),
            client_line(2, "flow_enforced", producer="p-2", capacity=50),
        ],
        [("/", "orders", 1000, None)],
    )
    assert (row["capacity_sum"], row["worst_case_depth"], row["stop_ok"]) == (100, 1000, True)
    assert row["stop_rule"] == "stop.ok"
    assert row["stop_advice"] == (
        "OK: stop 900 + producer capacities 100 (2 producers in client logs) = 1,000 "
        "<= queue maximum 1,000"
    )


def test_advice_lowers_a_stop_threshold_that_overflows_the_maximum(spark: SparkSession) -> None:
    row = _advice(
        spark, [client_line(1, "flow_enforced", capacity=200)], [("/", "orders", 1000, None)]
    )
    assert (row["stop_ok"], row["suggested_stop_count"]) == (False, 800)
    assert row["stop_rule"] == "stop.lower"
    assert row["stop_advice"].startswith("LOWER STOP: stop 900 + producer capacities 200")
    assert row["stop_advice"].endswith("set qpid.flow_stop_count <= 800")


def test_advice_says_when_capacities_and_maximum_are_unknown(spark: SparkSession) -> None:
    row = _advice(spark, None, None)
    assert row["stop_ok"] is None
    assert row["stop_advice"] == (
        "producer capacities unknown (no client log for queue://orders) and queue maximum "
        "unknown: depth can reach stop 900 + the sum of producer capacities"
    )


def test_advice_uses_the_maximum_when_only_capacities_are_unknown(spark: SparkSession) -> None:
    row = _advice(spark, [], [("/", "orders", 1200, None)])
    assert row["stop_advice"].endswith(
        ": stop 900 leaves 300 messages under queue maximum 1,200; the producers' capacities "
        "must sum to at most that"
    )


def test_advice_raises_resume_when_producers_stay_blocked_for_the_drain(
    spark: SparkSession,
) -> None:
    row = _advice(spark, None, None)
    # 402 messages in 40s = 10.05 msg/s; 5s of drain = 51 messages below stop 900.
    assert row["drain_rate_msgs_s"] == pytest.approx(10.05)
    assert row["suggested_resume_count"] == 849
    assert row["resume_rule"] == "resume.raise"
    assert row["resume_advice"] == (
        "RAISE RESUME: producers blocked p50 40.0s while the queue drained from stop 900 to "
        "resume 500 at 10.1 msg/s; resume at 849 to keep blocks near 5s (at the cost of more "
        "frequent stops)"
    )


def test_advice_refuses_a_non_positive_target(spark: SparkSession) -> None:
    events = events_of(spark, over(0, "orders"))
    with pytest.raises(ValueError, match="target_block_s"):
        advice_rules(queue_episode_stats(queue_episodes(events)), None, None, target_block_s=0)


def test_every_advice_rule_has_words() -> None:
    rule_ids = {rule.id for rule in (*STOP_RULES, *RESUME_RULES)}
    assert rule_ids == set(TEMPLATES)


def test_advice_words_fill_figures_as_the_template_says(spark: SparkSession) -> None:
    row = spark.createDataFrame(
        [(1200, 40.04, "queue://q", None)], "n long, x double, d string, p long"
    ).select(render("{n} at {x:.1f} to {d:text} by {p:s}").alias("w"))
    assert row.first()["w"] == "1,200 at 40.0 to queue://q by null"


def test_advice_words_refuse_an_unknown_way_to_show_a_figure(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="unknown way"):
        render("{n:x}")
