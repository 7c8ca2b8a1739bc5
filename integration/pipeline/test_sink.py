"""publish_dataframe against a real RabbitMQ, and through the flow-controlling gateway."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from integration.broker.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_pipeline import publish_dataframe
from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.sink import ROW_ID_HEADER

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Rows each test publishes (from 4 partitions, each publishing on a connection of its own).
ROWS = 12_000
PARTITIONS = 4
#: The deliberately slow consumer's rate in the flow-controlled test: far
#: below the job's publish rate on any machine here, so the queue passes its
#: flow-stop of 2,000 within about two seconds and is held there for the rest
#: of the run (about 12 s).
SLOW_CONSUMER_PER_S = 1000


class Collector(threading.Thread):
    """Consumes a queue, recording every row id; optionally slowly (``per_second``)."""

    def __init__(self, url: str, queue: str, expected: int, per_second: float | None = None):
        super().__init__(daemon=True)
        self.url, self.queue, self.expected, self.per_second = url, queue, expected, per_second
        self.ids: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=200)
            started = time.monotonic()
            for method, props, body in channel.consume(self.queue, inactivity_timeout=0.5):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                self.ids.append(str((props.headers or {})[ROW_ID_HEADER]))
                self.bodies.append(json.loads(body))
                channel.basic_ack(method.delivery_tag)
                if self.per_second is not None:
                    # Deliberately slow consumer: keep to per_second on average.
                    ahead = len(self.ids) / self.per_second - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                if len(self.ids) >= self.expected:
                    break
            channel.cancel()
            connection.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def rows(spark: SparkSession) -> Any:
    return spark.range(0, ROWS, numPartitions=PARTITIONS).select(
        F.col("id"), (F.col("id") * 2).alias("double")
    )


def test_every_row_arrives_exactly_once_by_id(
    spark: SparkSession,
    broker: Broker,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    queue = unique_name("sink")
    cleanup_queues.append(queue)
    connection = broker.blocking_connection()
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    collector = Collector(broker.url, queue, ROWS)
    collector.start()

    publish_dataframe(rows(spark), queue, url=broker.url, capacity=200)

    collector.join(timeout=240)
    assert collector.error is None, collector.error
    assert len(collector.ids) == ROWS, f"received {len(collector.ids)} of {ROWS}"
    assert len(set(collector.ids)) == ROWS
    assert sorted(b["id"] for b in collector.bodies) == list(range(ROWS))


def test_flow_controlled_queue_throttles_the_job_within_its_bound(
    spark: SparkSession,
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    tmp_path: Path,
) -> None:
    gateway = gateway_factory()
    queue = unique_name("flow")
    cleanup_queues.append(queue)
    capacity = 100
    connection = gateway.connect()
    connection.channel().queue_declare(
        queue,
        durable=True,
        arguments={"qpid.flow_stop_count": 2000, "qpid.flow_resume_count": 1000},
    )
    connection.close()
    peak = {"messages": 0, "polls": 0}
    poll_errors: list[BaseException] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            try:
                depth = int(gateway.queue(queue).get("messages", 0))
            except Exception as exc:  # an admin API hiccup must not end the watch
                poll_errors.append(exc)
            else:
                peak["messages"] = max(peak["messages"], depth)
                peak["polls"] += 1
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    collector = Collector(gateway.url, queue, ROWS, per_second=SLOW_CONSUMER_PER_S)
    collector.start()

    publish_dataframe(rows(spark), queue, url=gateway.url, capacity=capacity, id_column="id")

    collector.join(timeout=240)
    watching.set()
    watcher.join(timeout=5)
    assert collector.error is None, collector.error
    assert len(collector.ids) == ROWS
    assert len(set(collector.ids)) == ROWS
    assert peak["polls"] > len(poll_errors), f"admin API polls failed: {poll_errors[:3]}"
    bound = 2000 + PARTITIONS * capacity
    assert 0 < peak["messages"] <= bound, f"peak depth {peak['messages']} > bound {bound}"
    overfull = wait_for(lambda: gateway.events("QUE-1003", queue=queue), what="QUE-1003 logged")
    assert overfull[0]["message_capacity"] == 2000

    # The job's own event log, analysed: it finds the episodes the gateway logged.
    result = analyze(spark, [str(gateway.event_log)], tmp_path / "out")
    episodes = spark.read.parquet(str(tmp_path / "out" / "episodes")).where(F.col("queue") == queue)
    assert episodes.count() == len(overfull)
    assert result.malformed == 0
