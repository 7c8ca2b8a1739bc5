"""The sink's pure parts: deterministic ids, bodies, ordered sends with a fake producer."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row

from rabbitflow_pipeline.sink import (
    SinkError,
    message_id,
    partition_messages,
    publish_dataframe,
    send_messages,
)


class FakeProducer:
    def __init__(self, fail_at: int | None = None, close_error: Exception | None = None) -> None:
        self.sent: list[tuple[str, str]] = []
        self.closed = False
        self.fail_at = fail_at
        self.close_error = close_error

    def send(self, body: str, message_id: str) -> None:
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            raise RuntimeError("broker went away")
        self.sent.append((message_id, body))

    def close(self) -> None:
        self.closed = True
        if self.close_error is not None:
            raise self.close_error


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


def test_a_failed_send_is_the_error_reported_even_when_closing_fails_too() -> None:
    producer = FakeProducer(fail_at=1, close_error=ValueError("2 sends unconfirmed"))
    with pytest.raises(RuntimeError, match="went away") as info:
        send_messages(producer, [("a", "1"), ("b", "2")])
    assert producer.closed
    assert info.value.__notes__ == [
        "closing the producer then failed too: ValueError('2 sends unconfirmed')"
    ]


def test_a_struct_column_is_sent_as_an_object_with_its_field_names() -> None:
    rows = [Row(s=Row(a=1, b="x"))]
    ((_, body),) = partition_messages(0, rows, prefix="p", column="s")
    assert json.loads(body) == {"a": 1, "b": "x"}


def test_binary_and_non_finite_values_make_valid_json_as_sparks_to_json_writes_them() -> None:
    rows = [Row(raw=bytearray(b"\x00\x01"), ratio=float("nan"), top=float("inf"), n=1.5)]
    ((_, body),) = partition_messages(0, rows, prefix="p")
    assert json.loads(body, parse_constant=lambda c: pytest.fail(f"bare {c} in {body}")) == {
        "raw": "AAE=",
        "ratio": "NaN",
        "top": "Infinity",
        "n": 1.5,
    }


def test_binary_that_is_not_utf8_text_is_refused_naming_the_column() -> None:
    with pytest.raises(SinkError, match="'raw' holds bytes that are not UTF-8"):
        list(partition_messages(0, [Row(raw=b"\xff")], prefix="p", column="raw"))


@pytest.mark.parametrize("value", [0, "0", -1])
def test_a_zero_wait_for_confirms_is_refused_before_any_row_is_read(value: object) -> None:
    class NoRows:  # what publish_dataframe reads of a DataFrame before its job
        columns = ["a"]

        def foreachPartition(self, run: object) -> None:
            pytest.fail("rows were read")

    with pytest.raises(SinkError, match=r"qpid\.flow_control_wait_failure"):
        publish_dataframe(
            NoRows(),  # type: ignore[arg-type]
            "orders",
            properties={"qpid.flow_control_wait_failure": value},
        )
