"""End to end: real overfull/underfull episodes on a gateway, then rabbitflow-analyze."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from integration.broker.conftest import RunningGateway, wait_for
from rabbitflow_pipeline.batch import analyze

pytestmark = pytest.mark.spark

STOP, RESUME = 20, 10


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def test_analyze_finds_exactly_the_episodes_the_gateway_logged(
    spark: SparkSession,
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    tmp_path: Path,
) -> None:
    gateway = gateway_factory()
    queue = unique_name("e2e")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.queue_declare(
        queue, arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME}
    )
    for episode in range(3):
        for n in range(STOP + 1):
            channel.basic_publish("", queue, f"{episode}-{n}".encode())
        wait_for(
            lambda e=episode: len(gateway.events("QUE-1003", queue=queue)) == e + 1,
            what=f"QUE-1003 #{episode + 1}",
        )
        if episode == 2:
            break  # the last episode stays open
        for _ in range(STOP + 1 - (RESUME - 1)):
            method, _, _ = channel.basic_get(queue, auto_ack=True)
            assert method is not None
        wait_for(
            lambda e=episode: len(gateway.events("QUE-1004", queue=queue)) == e + 1,
            what=f"QUE-1004 #{episode + 1}",
        )
        for _ in range(RESUME - 1):
            channel.basic_get(queue, auto_ack=True)
    connection.close()

    overs = gateway.events("QUE-1003", queue=queue)
    unders = gateway.events("QUE-1004", queue=queue)
    analyze(spark, [str(gateway.event_log)], tmp_path / "out")

    episodes = (
        spark.read.parquet(str(tmp_path / "out" / "episodes"))
        .where(F.col("queue") == queue)
        .orderBy("start")
        .collect()
    )
    assert [(e["start"], e["end"], e["open"]) for e in episodes] == [
        (_ts(overs[0]["ts"]), _ts(unders[0]["ts"]), False),
        (_ts(overs[1]["ts"]), _ts(unders[1]["ts"]), False),
        (_ts(overs[2]["ts"]), None, True),
    ]
    assert {(e["stop_count"], e["resume_count"]) for e in episodes[:2]} == {(STOP, RESUME)}
    summary = (
        spark.read.parquet(str(tmp_path / "out" / "queue_summary"))
        .where(F.col("queue") == queue)
        .collect()
    )
    assert summary[0]["flow_stopped_count"] == 3
