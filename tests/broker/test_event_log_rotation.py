"""The gateway's event log rotates by size and by age, never splitting or losing a record."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from rabbitflow_broker.events import QueueOverfull
from rabbitflow_broker.hub.config import ConfigError, GatewayConfig
from rabbitflow_broker.server.service_io import EventSink

T0 = dt.datetime(2026, 11, 22, 5, 0, 0, tzinfo=dt.UTC)


def event(n: int) -> QueueOverfull:
    return QueueOverfull(
        ts=T0 + dt.timedelta(seconds=n),
        vhost="/",
        queue=f"q{n}",
        size=1200,
        capacity=1000,
        messages=12,
        message_capacity=900,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queues(path: Path) -> list[str]:
    return [json.loads(line)["queue"] for line in path.read_text().splitlines()]


def test_rotates_by_size_keeping_the_newest_files_and_whole_records(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    record_bytes = len(json.dumps(event(0).to_record(), default=str)) + 1
    sink = EventSink(str(log), max_bytes=3 * record_bytes, keep=2)
    for n in range(10):
        sink(event(n))
    sink.close()
    # Three records per file; the oldest file (q0-q2) went past keep=2.
    assert queues(log) == ["q9"]
    assert queues(tmp_path / "events.jsonl.1") == ["q6", "q7", "q8"]
    assert queues(tmp_path / "events.jsonl.2") == ["q3", "q4", "q5"]
    assert not (tmp_path / "events.jsonl.3").exists()
    for path in tmp_path.iterdir():
        assert path.stat().st_size <= 3 * record_bytes


def test_rotates_by_age_and_keeps_the_renamed_file_identity(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    clock = FakeClock()
    sink = EventSink(str(log), max_age_s=60, clock=clock)
    sink(event(0))
    inode = log.stat().st_ino
    clock.now += 59
    sink(event(1))
    clock.now += 1
    sink(event(2))
    sink.close()
    assert queues(tmp_path / "events.jsonl.1") == ["q0", "q1"]
    assert (tmp_path / "events.jsonl.1").stat().st_ino == inode
    assert queues(log) == ["q2"]


def test_appends_to_an_existing_log_counting_its_size(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    record_bytes = len(json.dumps(event(0).to_record(), default=str)) + 1
    first = EventSink(str(log))
    first(event(0))
    first.close()
    sink = EventSink(str(log), max_bytes=2 * record_bytes)
    sink(event(1))
    sink(event(2))
    sink.close()
    assert queues(tmp_path / "events.jsonl.1") == ["q0", "q1"]
    assert queues(log) == ["q2"]


def test_rotation_options_are_validated() -> None:
    config = GatewayConfig(event_log="e.jsonl", event_log_max_bytes=1 << 20, event_log_keep=3)
    assert (config.event_log_max_bytes, config.event_log_keep, config.event_log_max_age) == (
        1 << 20,
        3,
        0,
    )
    with pytest.raises(ConfigError, match="--event-log-keep"):
        GatewayConfig(event_log_keep=0)
    with pytest.raises(ConfigError, match="--event-log-max-bytes"):
        GatewayConfig(event_log_max_bytes=-1)
