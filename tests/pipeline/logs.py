"""Hand-written gateway and client logs for the pipeline tests."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from rabbitflow_broker.events import (
    ChannelFlowEnforced,
    ChannelFlowIgnored,
    ChannelFlowRemoved,
    Event,
    QueueOverfull,
    QueueUnderfull,
    StoreOverfull,
    StoreUnderfull,
)
from rabbitflow_pipeline.schemas import LINES_SCHEMA

T0 = dt.datetime(2026, 11, 22, 5, 0, 0, tzinfo=dt.UTC)
GW_A = "file:///logs/gw-a.jsonl"
GW_B = "file:///logs/gw-b.jsonl"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def over(
    t: float,
    queue: str,
    *,
    messages: int = 901,
    size: int = 9010,
    vhost: str = "/",
    stop: int = 900,
    stop_size: int = 0,
) -> QueueOverfull:
    return QueueOverfull(
        ts=at(t),
        vhost=vhost,
        queue=queue,
        size=size,
        capacity=stop_size,
        messages=messages,
        message_capacity=stop,
    )


def under(
    t: float,
    queue: str,
    *,
    messages: int = 499,
    size: int = 4990,
    vhost: str = "/",
    resume: int = 500,
    resume_size: int = 0,
) -> QueueUnderfull:
    return QueueUnderfull(
        ts=at(t),
        vhost=vhost,
        queue=queue,
        size=size,
        resume_capacity=resume_size,
        messages=messages,
        message_capacity=resume,
    )


CHANNEL: dict[str, Any] = {
    "vhost": "/",
    "user": "guest",
    "remote_host": "10.0.0.5",
    "remote_port": 50514,
}


def enforced(t: float, connection: int, channel: int, queue: str) -> ChannelFlowEnforced:
    return ChannelFlowEnforced(
        ts=at(t), connection=connection, channel=channel, queue=queue, **CHANNEL
    )


def removed(t: float, connection: int, channel: int) -> ChannelFlowRemoved:
    return ChannelFlowRemoved(ts=at(t), connection=connection, channel=channel, **CHANNEL)


def ignored(t: float, connection: int, channel: int) -> ChannelFlowIgnored:
    return ChannelFlowIgnored(ts=at(t), connection=connection, channel=channel, **CHANNEL)


def store_over(t: float, vhost: str = "/") -> StoreOverfull:
    return StoreOverfull(ts=at(t), vhost=vhost, size=2000, overfull_size=1500, underfull_size=1000)


def store_under(t: float, vhost: str = "/") -> StoreUnderfull:
    return StoreUnderfull(ts=at(t), vhost=vhost, size=900, overfull_size=1500, underfull_size=1000)


def line(event: Event) -> str:
    return json.dumps(event.to_record())


def _subject_vhost(vhost: str) -> str:
    return vhost if vhost.startswith("/") else "/" + vhost


def channel_closed(
    t: float, connection: int, channel: int, *, vhost: str = "/", remote_port: int = 50514
) -> str:
    """A gateway JSON record of CHN-1003 (channel closed), as the gateway writes it."""
    subject = (
        f"[con:{connection}(guest@10.0.0.5:{remote_port}{_subject_vhost(vhost)})/ch:{channel}]"
    )
    return json.dumps(
        {
            "ts": at(t).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "code": "CHN-1003",
            "subject": subject,
            "message": "Close",
            "vhost": vhost,
            "connection": connection,
            "user": "guest",
            "remote_host": "10.0.0.5",
            "remote_port": remote_port,
            "channel": channel,
        }
    )


def connection_closed(t: float, connection: int, *, vhost: str = "/") -> str:
    """A gateway JSON record of CON-1002 (connection closed), as the gateway writes it."""
    return json.dumps(
        {
            "ts": at(t).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "code": "CON-1002",
            "subject": f"[con:{connection}(guest@10.0.0.5:50514{_subject_vhost(vhost)})]",
            "message": "Close",
            "vhost": vhost,
            "connection": connection,
            "user": "guest",
            "remote_host": "10.0.0.5",
            "remote_port": 50514,
        }
    )


def lines_df(spark: SparkSession, rows: list[tuple[str, str]]) -> DataFrame:
    """(source, line) rows in one partition, so input order is the log's order."""
    return spark.createDataFrame([(text, source) for source, text in rows], LINES_SCHEMA).coalesce(
        1
    )


def gateway_log(spark: SparkSession, *events: Event, source: str = GW_A) -> DataFrame:
    return lines_df(spark, [(source, line(e)) for e in events])


def client_line(
    t: float,
    flow_event: str,
    *,
    producer: str = "p-1",
    destination: str = "queue://orders",
    waited_ms: int | None = None,
    capacity: int | None = 100,
) -> str:
    record: dict[str, Any] = {
        "timestamp": at(t).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": "warning",
        "logger": "rabbitflow.client",
        "event": flow_event,
        "flow_event": flow_event,
        "producer": producer,
        "destination": destination,
    }
    if waited_ms is not None:
        record["waited_ms"] = waited_ms
    if capacity is not None:
        record["capacity"] = capacity
    return json.dumps(record)
