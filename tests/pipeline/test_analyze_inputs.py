"""One event list written as full records, SPEC-minimum records, Broker-J lines and a mix:
``rabbitflow-analyze`` finds the same episodes, queue summary and channel blocks in each.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from rabbitflow_broker.events import ChannelEvent, Event, QueueEvent, StoreEvent
from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.cli import main

from .logs import (
    at,
    channel_closed,
    connection_closed,
    enforced,
    ignored,
    line,
    over,
    removed,
    store_over,
    store_under,
    under,
)

pytestmark = pytest.mark.spark

#: The event list every form is written from: episodes on two vhosts (one
#: left open), blocks closed by each closing code (and one left open), a
#: store episode.  CHN-1003/CON-1002 are given as the gateway's JSON records.
EVENTS: list[Event | str] = [
    over(0, "orders", messages=1_200, size=1_200_000),
    enforced(0.5, 7, 1, "orders"),
    enforced(0.75, 7, 2, "orders"),
    over(1, "orders", vhost="billing", stop=5_000, messages=5_001, size=50_010),
    enforced(1.5, 8, 1, "orders"),
    store_over(2),
    enforced(2.5, 9, 1, "** All Queues **"),
    removed(10.25, 7, 1),
    ignored(11, 7, 2),
    under(12.125, "orders", messages=400, size=4_000),
    channel_closed(13, 8, 1),
    enforced(14, 10, 1, "orders"),
    store_under(15),
    over(20, "orders", messages=950),
    enforced(21, 7, 3, "orders"),
    connection_closed(22, 10),
    under(30, "orders", vhost="billing", messages=10, resume=4_000),
]

#: A Broker-J line of a code the analysis does not use, and a blank line.
OTHER_LINES = [
    "2026-11-22 05:00:00,000 INFO  [IO-/10.0.0.5:50514] (q.m.c.open) - "
    "[con:7(guest@/10.0.0.5:50514/)] CON-1001 : Open : Client ID : app",
    "",
]

# What a record needs (SPEC): ts, code, subject, message, vhost and its subject's fields.
_SUBJECT_FIELDS: dict[type, tuple[str, ...]] = {
    QueueEvent: ("queue",),
    ChannelEvent: ("connection", "user", "remote_host", "remote_port", "channel"),
    StoreEvent: ("store",),
}


_CLOSE_FIELDS = ("connection", "user", "remote_host", "remote_port", "channel")


def full(event: Event | str) -> str:
    return event if isinstance(event, str) else line(event)


def minimum(event: Event | str) -> str:
    keep = ["ts", "code", "subject", "message", "vhost"]
    if isinstance(event, str):
        record = json.loads(event)
        keep += [name for name in _CLOSE_FIELDS if name in record]
    else:
        record = event.to_record()
        for base, names in _SUBJECT_FIELDS.items():
            if isinstance(event, base):
                keep += names
    return json.dumps({k: record[k] for k in keep})


def broker_j_subject(event: Event | str) -> str:
    """The subject as Broker-J prints it (``vh(/test)``; ``guest@/10.0.0.5:50514/test``)."""
    if isinstance(event, str):
        # The gateway's close subjects differ from Broker-J's only by its "/" before the host.
        return str(json.loads(event)["subject"]).replace("@", "@/")
    path = "/" if event.vhost == "/" else "/" + event.vhost
    if isinstance(event, QueueEvent):
        return f"[vh({path})/qu({event.queue})]"
    if isinstance(event, StoreEvent):
        return f"[vh({path})/ms({event.store})]"
    assert isinstance(event, ChannelEvent)
    connection = f"con:{event.connection}({event.user}@/{event.remote_host}:{event.remote_port}"
    return f"[{connection}{path})/ch:{event.channel}]"


def _time_code_message(event: Event | str) -> tuple[dt.datetime, str, str]:
    if isinstance(event, str):
        record = json.loads(event)
        ts = dt.datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
        return ts, record["code"], record["message"]
    return event.ts, event.code, event.message


def broker_j(event: Event | str) -> str:
    """A Broker-J operational log line: log4j time, actor and subject after MESSAGE."""
    ts, code, message = _time_code_message(event)
    when = ts.strftime("%Y-%m-%d %H:%M:%S") + f",{ts.microsecond // 1000:03d}"
    subject = broker_j_subject(event)
    return (
        f"{when} INFO  [IO-/10.0.0.5:50514] (q.m.x) - MESSAGE {subject} {subject} "
        f"{code} : {message}"
    )


def broker_j_iso(event: Event | str) -> str:
    """A Broker-J subject and code after an ISO-8601 time."""
    ts, code, message = _time_code_message(event)
    return f"{ts.isoformat()} {broker_j_subject(event)} {code} : {message}"


def mixed(index: int, event: Event | str) -> str:
    forms: list[Callable[[Event | str], str]] = [full, minimum, broker_j, broker_j_iso]
    return forms[index % len(forms)](event)


def write_log(path: Path, render: Callable[[int, Event | str], str], extra: list[str]) -> str:
    lines = [render(i, e) for i, e in enumerate(EVENTS)]
    path.write_text("\n".join([*extra, *lines]) + "\n", encoding="utf-8")
    return str(path)


FORMS: dict[str, tuple[Callable[[int, Event | str], str], list[str]]] = {
    "spec_minimum_json": (lambda _, e: minimum(e), []),
    "broker_j_lines": (lambda _, e: broker_j(e), OTHER_LINES),
    "mix_with_full_records": (mixed, OTHER_LINES),
}

COMPARED = ("episodes", "queue_summary", "channel_blocks")


def tables(spark: SparkSession, out: Path) -> dict[str, DataFrame]:
    # ``source`` names the file each block came from, which differs per form.
    return {
        name: spark.read.parquet(str(out / name)).drop("source")
        for name in (*COMPARED, "store_episodes")
    }


@pytest.fixture(scope="module")
def expected(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("full")
    result = analyze(spark, [write_log(base / "full.log", lambda _, e: full(e), [])], base / "out")
    assert (result.malformed, result.episodes) == (0, 3)
    return base / "out"


@pytest.mark.parametrize("form", list(FORMS))
def test_every_input_form_yields_the_tables_of_the_full_records(
    spark: SparkSession, tmp_path: Path, expected: Path, form: str
) -> None:
    render, extra = FORMS[form]
    out = tmp_path / "out"
    result = analyze(spark, [write_log(tmp_path / f"{form}.log", render, extra)], out)
    assert result.malformed == 0
    want, got = tables(spark, expected), tables(spark, out)
    for name in COMPARED:
        assertDataFrameEqual(got[name], want[name])
    # Store figures are not in MST texts; the episodes themselves are the same.
    keys = ["vhost", "start", "end", "duration_s", "open"]
    assertDataFrameEqual(got["store_episodes"].select(keys), want["store_episodes"].select(keys))


def test_full_records_show_every_closing_rule(spark: SparkSession, expected: Path) -> None:
    blocks = spark.read.parquet(str(expected / "channel_blocks"))

    def utc(t: float) -> dt.datetime:  # timestamps come back naive, in UTC
        return at(t).replace(tzinfo=None)

    assertDataFrameEqual(
        blocks.select("connection", "channel", "start", "end", "closed_by"),
        [
            (7, 1, utc(0.5), utc(10.25), "CHN-1006"),
            (7, 2, utc(0.75), utc(11), "CHN-1012"),
            (8, 1, utc(1.5), utc(13), "CHN-1003"),
            (9, 1, utc(2.5), None, None),
            (10, 1, utc(14), utc(22), "CON-1002"),
            (7, 3, utc(21), None, None),
        ],
    )


def test_analyze_exits_non_zero_naming_the_commonest_reason_when_every_line_is_malformed(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "not-events.log"
    log.write_text(
        "\n".join(
            ["Exception in thread main"] * 3
            + ["2026-11-22 05:00:00,000 WARN  [main] (o.a.q.s.Broker) - disk is slow"] * 2
            + ['{"ts": "2026-11-22T05:00:00Z"']
        )
        + "\n",
        encoding="utf-8",
    )
    status = main([str(log), "--out", str(tmp_path / "out")], spark=spark)
    assert status == 1
    assert "commonest reason: no_timestamp (3 lines)" in capsys.readouterr().err
    # The same input incremental: the step says so, and so does a step with
    # nothing new (the reasons are then in the stored table).
    live = ["--out", str(tmp_path / "live"), "--incremental"]
    assert main([str(log), *live], spark=spark) == 1
    first = capsys.readouterr().err
    assert "commonest reason: no_timestamp (3 lines)" in first
    count = first.split("every one of the ")[1].split(" ")[0]
    assert main([str(log), *live], spark=spark) == 1
    err = capsys.readouterr().err
    assert f"every one of the {count} event-log lines read so far is malformed" in err
