"""send() under a full ``x-overflow: reject-publish`` queue (issue 2, item 1).

One scenario, run once for the module on the shared broker: a queue with
``x-max-length`` 100 and reject-publish and no consumer; a producer of
capacity 10 (wait-failure 3000 ms, notify period 1000 ms) sends messages
numbered 1..150 until a send raises.  Then a raw-pika consumer starts, a
new message is sent, and the queue's whole output is collected.  Each test
asserts one behaviour of that run.

"Accepted" = the messages whose ``send()`` returned normally.  Those beyond
the 100th were nacked by the broker and are the SDK's to re-send, in order,
once there is room; the message whose ``send()`` raised was not sent.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

import rabbitflow

from ..conftest import Broker
from ._support import (
    CLIENT_LOGGER,
    QueueCollector,
    client_messages,
    declare_queue,
    drain,
    numbers,
    ready_count,
    wait_until,
)

MAX_LENGTH = 100
ATTEMPTS = 150
WAIT_FAILURE_MS = 3000


class _Recorder(logging.Handler):
    """caplog for a module-scoped run: a handler on the root logger, so only
    records that propagate from ``rabbitflow.client`` (as a user's logging
    configuration would see them) are kept."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Run:
    queue: str
    returned: list[int] = field(default_factory=list)
    failed: int | None = None
    error: BaseException | None = None
    failed_after_s: float = 0.0
    ready_at_timeout: int = -1
    new_message: int = 0
    new_send_error: BaseException | None = None
    delivery_timeout: AssertionError | None = None
    arrived: list[int] = field(default_factory=list)
    records: list[logging.LogRecord] = field(default_factory=list)

    @property
    def accepted(self) -> list[int]:
        return list(self.returned)


def _scenario(url: str, queue: str) -> Run:
    run = Run(queue)
    declare_queue(url, queue, {"x-max-length": MAX_LENGTH, "x-overflow": "reject-publish"})
    factory = rabbitflow.ConnectionFactory(
        url,
        properties={
            "qpid.flow_control_wait_failure": WAIT_FAILURE_MS,
            "qpid.flow_control_wait_notify_period": 1000,
        },
    )
    connection = factory.create_connection()
    collector: QueueCollector | None = None
    bodies: list[bytes] = []
    try:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=10)
        for n in range(1, ATTEMPTS + 1):
            started = time.monotonic()
            try:
                producer.send(session.create_text_message(str(n)))
            except rabbitflow.FlowControlTimeoutError as exc:
                run.failed, run.error = n, exc
                run.failed_after_s = time.monotonic() - started
                break
            run.returned.append(n)
        run.ready_at_timeout = ready_count(url, queue)

        collector = QueueCollector(url, queue).start()
        run.new_message = (run.failed or ATTEMPTS) + 1
        try:
            producer.send(session.create_text_message(str(run.new_message)))
        except rabbitflow.JMSException as exc:
            run.new_send_error = exc
        expected = len(run.accepted) + (run.new_send_error is None)
        # The SDK re-sends the nacked ones with backoff: it must deliver all it
        # accepted while the connection is open (not only when it closes).
        try:
            wait_until(lambda: collector.count >= expected, 30, f"{expected} messages")
        except AssertionError as exc:
            run.delivery_timeout = exc
    finally:
        connection.close()
        if collector is not None:
            bodies = collector.stop()
    run.arrived = numbers(bodies + drain(url, queue))
    return run


@pytest.fixture(scope="module")
def run(broker: Broker) -> Iterator[Run]:
    queue = f"rf-reject-publish-{uuid.uuid4().hex[:8]}"
    recorder = _Recorder()
    logger = logging.getLogger(CLIENT_LOGGER)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(recorder)
    try:
        result = _scenario(broker.url, queue)
        result.records = recorder.records
        yield result
    finally:
        logging.getLogger().removeHandler(recorder)
        logger.setLevel(old_level)
        connection = broker.blocking_connection()
        try:
            connection.channel().queue_delete(queue)
        finally:
            connection.close()


def test_first_hundred_sends_return(run: Run) -> None:
    assert run.returned[:MAX_LENGTH] == list(range(1, MAX_LENGTH + 1))


def test_a_send_raises_flow_control_timeout_once_the_queue_is_full(run: Run) -> None:
    assert run.failed is not None, f"all {ATTEMPTS} sends returned"
    assert run.failed > MAX_LENGTH
    assert isinstance(run.error, rabbitflow.FlowControlTimeoutError)


def test_timeout_error_names_the_wait_in_seconds(run: Run) -> None:
    assert str(run.error) == (
        "Unable to send message for 3 seconds due to broker enforced flow control"
    )


def test_send_raises_after_the_wait_failure_time(run: Run) -> None:
    # A behaviour check (it waited about 3 s, not 0 and not forever), not a speed test.
    assert 2.5 <= run.failed_after_s < 30, run.failed_after_s


def test_blocked_send_warns_every_notify_period(run: Run) -> None:
    warnings = client_messages(run.records, logging.WARNING)
    for seconds in (1, 2):
        line = f"Message send delayed by {seconds}s due to broker enforced flow control"
        assert any(line in message for message in warnings), (seconds, warnings)


def test_timeout_is_logged_at_error(run: Run) -> None:
    errors = client_messages(run.records, logging.ERROR)
    line = "Message send failed due to timeout waiting on broker enforced flow control"
    assert any(line in message for message in errors), errors


def test_full_queue_holds_exactly_the_first_hundred_in_order(run: Run) -> None:
    # Nothing can enter a full reject-publish queue before a consumer takes
    # from it, so its first MAX_LENGTH messages out are what it held.
    assert run.ready_at_timeout == MAX_LENGTH
    assert run.arrived[:MAX_LENGTH] == list(range(1, MAX_LENGTH + 1))


def test_a_new_send_goes_through_once_a_consumer_drains_the_queue(run: Run) -> None:
    assert run.new_send_error is None, repr(run.new_send_error)
    assert run.new_message in run.arrived


def test_every_accepted_message_is_delivered_before_the_connection_closes(run: Run) -> None:
    assert run.delivery_timeout is None, str(run.delivery_timeout)


def test_every_accepted_message_arrives_once_in_order(run: Run) -> None:
    assert run.arrived == [*run.accepted, run.new_message]


def test_the_message_whose_send_raised_never_arrives(run: Run) -> None:
    assert run.failed is not None
    assert run.failed not in run.arrived
