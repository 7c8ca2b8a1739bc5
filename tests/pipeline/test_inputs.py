"""Event-log lines are read by content: full or minimal gateway JSON, and Broker-J's own lines."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from rabbitflow_pipeline.inputs import IGNORED, classify_events, parse_event_lines
from rabbitflow_pipeline.malformed import malformed_summary

from .logs import GW_A, at, line, lines_df, over

pytestmark = pytest.mark.spark

SPEC_EXAMPLE = (
    "2024-05-01 00:08:58,527 INFO  [IO-/127.0.0.1:40029] (q.m.q.overfull) - MESSAGE "
    "[vh(/test)/qu(MyQueue)] [vh(/test)/qu(MyQueue)] QUE-1003 : Overfull : Size : 1,200 bytes, "
    "Capacity : 1,000"
)


def parsed_of(spark: SparkSession, *texts: str) -> DataFrame:
    return parse_event_lines(lines_df(spark, [(GW_A, text) for text in texts]))


def test_broker_j_overfull_line_gives_its_vhost_queue_time_and_figures(
    spark: SparkSession,
) -> None:
    parsed = parsed_of(spark, SPEC_EXAMPLE)
    assertDataFrameEqual(
        parsed.select(
            "ts", "code", "vhost", "queue", "size", "capacity", "messages", "malformed_reason"
        ),
        [
            (
                dt.datetime(2024, 5, 1, 0, 8, 58, 527000),
                *("QUE-1003", "test", "MyQueue", 1200, 1000, None, None),
            )
        ],
    )


def test_broker_j_channel_line_takes_the_subject_before_the_code(spark: SparkSession) -> None:
    text = (
        "2024-05-01 00:09:00,001 INFO  [IO-/127.0.0.1:40029] (q.m.c.flow_enforced) - MESSAGE "
        "[con:3(guest@/127.0.0.1:40029/test)] [con:3(guest@/127.0.0.1:40029/test)/ch:2] "
        "CHN-1005 : Flow Control Enforced (Queue MyQueue)"
    )
    parsed = parsed_of(spark, text)
    assertDataFrameEqual(
        parsed.select(
            "code", "vhost", "connection", "channel", "user", "remote_host", "remote_port", "queue"
        ),
        [("CHN-1005", "test", 3, 2, "guest", "127.0.0.1", 40029, "MyQueue")],
    )


def test_iso_timestamp_with_an_offset_is_converted_to_utc(spark: SparkSession) -> None:
    text = "2024-05-01T02:08:58.527+02:00 [vh(/)/qu(q)] QUE-1004 : Underfull : Size : 0 bytes"
    parsed = parsed_of(spark, text)
    assertDataFrameEqual(
        parsed.select("ts", "vhost", "size", "malformed_reason"),
        [(dt.datetime(2024, 5, 1, 0, 8, 58, 527000), "/", 0, None)],
    )


def test_vhost_spellings_of_subjects_map_to_the_vhost(spark: SparkSession) -> None:
    texts = [
        f"2024-05-01 00:00:0{i},000 [vh({path})/qu(q)] QUE-1004 : Underfull : Size : 0 bytes"
        for i, path in enumerate(["/", "/test", "billing"])
    ]
    assertDataFrameEqual(
        parsed_of(spark, *texts).select("vhost"), [("/",), ("test",), ("billing",)]
    )


def test_broker_j_lines_of_other_codes_are_ignored_not_malformed(spark: SparkSession) -> None:
    text = (
        "2024-05-01 00:00:00,000 INFO  [IO-/127.0.0.1:40029] (q.m.c.open) - "
        "[con:3(guest@/127.0.0.1:40029/test)] CON-1001 : Open : Client ID : x"
    )
    parsed = parsed_of(spark, text)
    assertDataFrameEqual(parsed.select("malformed_reason"), [(IGNORED,)])
    assert malformed_summary(parsed).count() == 0


def test_text_lines_that_are_not_events_name_their_reason(spark: SparkSession) -> None:
    parsed = parsed_of(
        spark,
        "Exception in thread main",
        "2024-05-01 00:00:00,000 WARN  [main] (o.a.q.s.Broker) - disk is slow",
        "2024-13-01 00:00:00,000 [vh(/)/qu(q)] QUE-1003 : Overfull : Size : 1 bytes",
        "2024-05-01 00:00:00,000 [vh(/)] QUE-1003 : Overfull : Size : 1 bytes",
    )
    assertDataFrameEqual(
        parsed.select("malformed_reason"),
        [("no_timestamp",), ("no_event_code",), ("bad_ts",), ("missing_field",)],
    )


def test_minimal_json_record_takes_its_figures_from_the_message(spark: SparkSession) -> None:
    full = json.loads(line(over(1, "orders", messages=1200, size=12_000, stop=900, stop_size=0)))
    minimal = {k: full[k] for k in ("ts", "code", "subject", "message", "vhost", "queue")}
    parsed = parsed_of(spark, json.dumps(minimal))
    assertDataFrameEqual(
        parsed.select(
            "ts", "queue", "size", "capacity", "messages", "message_capacity", "malformed_reason"
        ),
        [(at(1).replace(tzinfo=None), "orders", 12_000, 0, 1200, 900, None)],
    )


def test_json_record_without_subject_fields_takes_them_from_its_subject(
    spark: SparkSession,
) -> None:
    full = json.loads(line(over(1, "orders")))
    bare = {k: full[k] for k in ("ts", "code", "subject", "message")}
    assertDataFrameEqual(
        parsed_of(spark, json.dumps(bare)).select("vhost", "queue", "malformed_reason"),
        [("/", "orders", None)],
    )


def test_fields_a_record_has_win_over_its_text_and_only_missing_ones_are_recovered(
    spark: SparkSession,
) -> None:
    full = json.loads(line(over(1, "orders", messages=1200, size=12_000, stop=900)))
    # vhost and size disagree with the subject and message: the record's own are kept.
    partial = {k: full[k] for k in ("ts", "code", "subject", "message")}
    partial.update(vhost="billing", size=5)
    assertDataFrameEqual(
        parsed_of(spark, json.dumps(partial)).select(
            "vhost", "queue", "size", "messages", "message_capacity", "malformed_reason"
        ),
        [("billing", "orders", 5, 1200, 900, None)],
    )


def test_per_row_parse_code_stays_small_enough_for_the_jit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """HotSpot never compiles a method of more than 8,000 bytes of bytecode (it stays
    interpreted): the recovery from subject and message must not grow the stage's loop
    past that (13,896 bytes when every recovery was written into the loop, and the
    parse took 2.1-3.8x the task CPU of the code before reading by content)."""
    from rabbitflow_pipeline.readers import read_events

    path = tmp_path / "gw.jsonl"
    path.write_text(line(over(1, "orders")) + "\n", encoding="utf-8")
    plan = classify_events(read_events(spark, [str(path)]))._jdf.queryExecution()
    debug = getattr(spark._jvm.org.apache.spark.sql.execution.debug, "package$").__getattr__(
        "MODULE$"
    )
    stages = debug.codegenStringSeq(plan.executedPlan())
    sizes = [stages.apply(i)._3().maxMethodCodeSize() for i in range(stages.size())]
    assert sizes, "no whole-stage generated code"
    assert max(sizes) <= 8000, sizes
