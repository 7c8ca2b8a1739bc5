"""Publish a DataFrame to a queue through the rabbitflow blocking producer.

Each Spark partition opens one rabbitflow connection and producer and sends
its rows in order; ``send()`` blocks while the broker (or the rabbitflow
gateway) enforces flow control, so a job writing to a flow-controlled queue
slows down instead of overflowing it.

Deduplication contract
----------------------
Every message carries a deterministic row id in the application header
``rabbitflow_row_id`` (the SDK stamps its own AMQP ``message_id`` on every
send, as JMS providers do):

* ``id_column`` given: the string value of that column (must be unique and
  non-null; a null id raises :class:`SinkError` and fails the task);
* otherwise ``<prefix>-<partition>-<row index in partition>``, where the
  prefix is random and fixed for one call: a task's retries keep the ids,
  a second call (a job run again after it failed) sends new ones.  This is
  deterministic only if the DataFrame's partitioning and row order are (a
  read of files, or a sort); after a shuffle without an ordering, or where
  a failed job is run again, pass ``id_column``.

A Spark task that fails after some of its rows were confirmed is retried
from the start of its partition; the retry re-sends those rows *with the
same ids*.  The sink is therefore at-least-once with idempotent ids:
consumers drop a ``rabbitflow_row_id`` they have already processed, which
makes the end result exactly-once.  Rows are never reordered within a partition and never
dropped: a send that fails raises, failing the task, and Spark retries it.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark import TaskContext
from pyspark.sql import DataFrame, Row

__all__ = [
    "ROW_ID_HEADER",
    "Producer",
    "SinkError",
    "message_id",
    "partition_messages",
    "publish_dataframe",
    "send_messages",
]


_WAIT_FAILURE = "qpid.flow_control_wait_failure"

#: Application header carrying the deterministic row id.
ROW_ID_HEADER = "rabbitflow_row_id"


class SinkError(Exception):
    """A row cannot be published (no id, no such column, non-text value)."""


class Producer(Protocol):
    """What the sink needs of a producer: send text with an id, then close."""

    def send(self, body: str, message_id: str) -> None: ...

    def close(self) -> None: ...


def message_id(prefix: str, partition: int, index: int) -> str:
    """The deterministic id of row ``index`` of ``partition``."""
    return f"{prefix}-{partition}-{index}"


def _json_default(value: object) -> str:
    # Timestamps, dates and decimals have no JSON type: ISO/str text keeps them
    # exact.  Binary values go as base64 text, as Spark's to_json writes them.
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return str(isoformat())
    return str(value)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as the strings Spark's to_json writes
    ("NaN", "Infinity", "-Infinity"): bare, they are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=_json_default, sort_keys=True, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: rare, so looked for only then
        return json.dumps(_finite(value), default=_json_default, sort_keys=True)


def _body(row: Row, column: str | None) -> str:
    if column is None:
        return _json(row.asDict(recursive=True))
    value = row[column]
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SinkError(f"{column!r} holds bytes that are not UTF-8 text: {exc}") from None
    if value is None:
        raise SinkError(f"row has a null {column!r}: nothing to send")
    if isinstance(value, Row):  # a struct: an object with its field names
        return _json(value.asDict(recursive=True))
    return value if isinstance(value, str) else _json(value)


def partition_messages(
    partition: int,
    rows: Iterable[Row],
    *,
    prefix: str,
    column: str | None = None,
    id_column: str | None = None,
) -> Iterator[tuple[str, str]]:
    """(message id, body) for each row of one partition, in order.

    Raises:
        SinkError: a null id in ``id_column`` or a null ``column`` value.
    """
    for index, row in enumerate(rows):
        if id_column is None:
            mid = message_id(prefix, partition, index)
        else:
            raw = row[id_column]
            if raw is None:
                raise SinkError(f"row {index} of partition {partition} has a null {id_column!r}")
            mid = str(raw)
        yield mid, _body(row, column)


def send_messages(producer: Producer, messages: Iterable[tuple[str, str]]) -> int:
    """Send every message in order, then close the producer; returns the count.

    The producer is closed even when a send raises: that error propagates
    (failing the Spark task so that it is retried), with a failure to close
    after it added as a note, not in its place.
    """
    count = 0
    try:
        for mid, body in messages:
            producer.send(body, mid)
            count += 1
    except BaseException as exc:
        try:
            producer.close()
        except Exception as close_exc:  # the send's error is the one to report
            exc.add_note(f"closing the producer then failed too: {close_exc!r}")
        raise
    producer.close()
    return count


@dataclass(frozen=True)
class _SdkProducerFactory:
    """Opens a rabbitflow connection + producer on an executor (picklable)."""

    url: str | None
    queue: str
    capacity: int
    properties: Mapping[str, Any] | None

    def __call__(self) -> Producer:
        import rabbitflow

        factory = rabbitflow.ConnectionFactory(
            self.url, properties=dict(self.properties) if self.properties else None
        )
        connection = factory.create_connection()
        try:
            session = connection.create_session()
            destination = session.create_queue(self.queue)
            producer = session.create_producer(destination, capacity=self.capacity)
        except BaseException:
            connection.close()
            raise
        return _SdkProducer(connection, session, producer)


class _SdkProducer:
    def __init__(self, connection: Any, session: Any, producer: Any) -> None:
        self._connection = connection
        self._session = session
        self._producer = producer

    def send(self, body: str, message_id: str) -> None:
        message = self._session.create_text_message(body)
        _set_message_id(message, message_id)
        self._producer.send(message)

    def close(self) -> None:
        # Closing the connection waits for outstanding confirms (SPEC §2).
        self._connection.close()


def _set_message_id(message: Any, mid: str) -> None:
    # send() stamps its own AMQP message_id (as JMS providers do), so the
    # row id travels as an application header.
    message.set_property(ROW_ID_HEADER, mid)


def _check_wait_failure(properties: Mapping[str, Any] | None) -> None:
    """Refuse ``qpid.flow_control_wait_failure`` 0: it also bounds the wait for
    a partition's last confirms, so every partition with rows would fail."""
    value = (properties or {}).get(_WAIT_FAILURE)
    try:
        zero = value is not None and float(value) <= 0
    except (TypeError, ValueError):
        return  # the SDK names a malformed value itself
    if zero:
        raise SinkError(
            f"{_WAIT_FAILURE}={value!r}: the sink waits for every confirm when a partition "
            "ends, at most this long; give it a positive number of milliseconds"
        )


def publish_dataframe(
    df: DataFrame,
    queue: str,
    *,
    url: str | None = None,
    capacity: int = 100,
    properties: Mapping[str, Any] | None = None,
    column: str | None = None,
    id_column: str | None = None,
    _producer_factory: Callable[[], Producer] | None = None,
) -> None:
    """Send every row of ``df`` to ``queue`` through the rabbitflow blocking producer.

    Each partition sends through its own producer of ``capacity``; the body
    is the row as a JSON object, or the text of ``column``.  Message ids
    follow the module's deduplication contract.  Returns once every
    partition's producer has closed (all sends confirmed).

    Raises:
        SinkError: ``column``/``id_column`` not in ``df``, ``capacity`` < 1, or
            ``qpid.flow_control_wait_failure`` 0 in ``properties``.
        pyspark.errors.PySparkException: a task failed after Spark's retries
            (e.g. ``rabbitflow.FlowControlTimeoutError`` in a send).
    """
    for name in (column, id_column):
        if name is not None and name not in df.columns:
            raise SinkError(f"column {name!r} not in DataFrame columns {df.columns}")
    if capacity < 1:
        raise SinkError(f"capacity must be at least 1, got {capacity}")
    _check_wait_failure(properties)
    factory: Callable[[], Producer] = _producer_factory or _SdkProducerFactory(
        url, queue, capacity, dict(properties) if properties else None
    )
    prefix = uuid.uuid4().hex[:12]

    def run(rows: Iterator[Row]) -> None:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        messages = partition_messages(
            partition, rows, prefix=prefix, column=column, id_column=id_column
        )
        first = next(messages, None)
        if first is not None:  # an empty partition opens no connection
            send_messages(factory(), itertools.chain((first,), messages))

    df.foreachPartition(run)
