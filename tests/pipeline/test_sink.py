"""The sink's pure parts: deterministic ids, bodies, ordered sends with a fake producer."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row

from rabbitflow_pipeline.sink import (
    SinkError,
    message_id,
    partition_messages,
    send_messages,
)


class FakeProducer:
    def __init__(self, fail_at: int | None = None) -> None:
        self.sent: list[tuple[str, str]] = []
        self.closed = False
        self.fail_at = fail_at

    def send(self, body: str, message_id: str) -> None:
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            raise RuntimeError("broker went away")
        self.sent.append((message_id, body))

    def close(self) -> None:
        self.closed = True


def test_generated_ids_are_prefix_partition_and_row_index() -> None:
    rows = [Row(a=1), Row(a=2)]
    ids = [mid for mid, _ in partition_messages(3, rows, prefix="job")]
    assert ids == [message_id("job", 3, 0), message_id("job", 3, 1)] == ["job-3-0", "job-3-1"]


def test_a_retried_partition_gets_the_same_ids() -> None:
    rows = [Row(a=i) for i in range(5)]
    first = list(partition_messages(1, rows, prefix="job"))
    again = list(partition_messages(1, rows, prefix="job"))
    assert first == again


def test_id_column_supplies_the_message_id() -> None:
    rows = [Row(key="order-9", v=1)]
    assert [mid for mid, _ in partition_messages(0, rows, prefix="x", id_column="key")] == [
        "order-9"
    ]


def test_null_id_column_value_is_refused() -> None:
    with pytest.raises(SinkError, match="null 'key'"):
        list(partition_messages(0, [Row(key=None)], prefix="x", id_column="key"))


def test_body_is_the_row_as_json_by_default() -> None:
    ((_, body),) = partition_messages(0, [Row(b=2, a="x")], prefix="p")
    assert json.loads(body) == {"a": "x", "b": 2}


def test_body_is_the_chosen_column_text() -> None:
    ((_, body),) = partition_messages(0, [Row(text="hello", n=1)], prefix="p", column="text")
    assert body == "hello"


def test_send_messages_sends_in_order_and_closes() -> None:
    producer = FakeProducer()
    count = send_messages(producer, [("a", "1"), ("b", "2"), ("c", "3")])
    assert (count, producer.sent, producer.closed) == (
        3,
        [("a", "1"), ("b", "2"), ("c", "3")],
        True,
    )


def test_send_messages_closes_the_producer_when_a_send_fails() -> None:
    producer = FakeProducer(fail_at=1)
    with pytest.raises(RuntimeError, match="went away"):
        send_messages(producer, [("a", "1"), ("b", "2")])
    assert (producer.sent, producer.closed) == ([("a", "1")], True)
