"""Issue 4 item 3: clients that ignore ``Channel.Flow(active=false)``.

A client with confirms that keeps publishing is closed with CHN-1012 after
``--flow-enforcement-timeout``; one without confirms is held by
back-pressure to the documented bound, then closed the same way.  Every
message the gateway accepted is in RabbitMQ: the queue holds an unbroken
prefix ``0..n-1`` of what the client published.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from integration.broker_ops.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.relay import PAUSE_BYTES, PAUSE_MESSAGES

STOP, RESUME = 20, 10
TIMEOUT_MS = 1000
SIZE = 1024
# docs/gateway.md: a flowed channel publishes up to the pause limit plus the
# message that crosses it; the gateway parses nothing after that message
# until reading resumes.
BOUND = min(PAUSE_MESSAGES, PAUSE_BYTES // SIZE) + 1

pytestmark = pytest.mark.slow


def _body(seq: int) -> bytes:
    return f"{seq}:".encode().ljust(SIZE, b".")


def _declare(gateway: RunningGateway, queue: str) -> None:
    connection = gateway.connect()
    connection.channel().queue_declare(
        queue,
        durable=True,
        arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME},
    )
    connection.close()


def _sequences_in_rabbitmq(broker: Broker, queue: str) -> list[int]:
    """Every message of the queue, straight from RabbitMQ (acked, so it empties)."""
    connection = broker.blocking_connection()
    channel = connection.channel()
    seqs: list[int] = []
    while True:
        method, _props, raw = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        seqs.append(int(raw.split(b":", 1)[0]))
    connection.close()
    return seqs


class IgnoringConfirmPublisher(threading.Thread):
    """pika SelectConnection publisher in confirm mode that never waits and ignores Flow."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.published = 0
        self.outstanding: set[int] = set()
        self.acked = 0
        self.close_reason: BaseException | None = None
        self.done = threading.Event()
        self._connection: pika.SelectConnection | None = None
        self._channel: object = None

    def run(self) -> None:
        try:
            self._connection = pika.SelectConnection(
                pika.URLParameters(self.url),
                on_open_callback=self._on_open,
                on_open_error_callback=lambda _c, exc: self._finish(exc),
                on_close_callback=lambda _c, _exc: self._connection.ioloop.stop(),  # type: ignore[union-attr]
            )
            self._connection.ioloop.start()
        finally:
            if self._connection is not None:
                # Its wake-up socketpair is otherwise left to the collector.
                self._connection.ioloop.close()
            self.done.set()

    def _finish(self, reason: BaseException) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        assert self._connection is not None
        if self._connection.is_open:
            self._connection.close()
        else:
            self._connection.ioloop.stop()

    def _on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        channel.add_on_close_callback(lambda _ch, reason: self._finish(reason))
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._publish())

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        tag, multiple = frame.method.delivery_tag, frame.method.multiple
        done = {t for t in self.outstanding if t <= tag} if multiple else {tag}
        self.outstanding -= done
        self.acked += len(done)

    def _publish(self) -> None:
        channel = self._channel
        assert isinstance(channel, pika.channel.Channel)
        if self.close_reason is not None or not channel.is_open:
            return
        channel.basic_publish(
            "", self.queue, _body(self.published), pika.BasicProperties(delivery_mode=2)
        )
        self.published += 1
        self.outstanding.add(self.published)
        assert self._connection is not None
        self._connection.ioloop.call_later(0.002, self._publish)


def _chn_1012_after_timeout(gateway: RunningGateway) -> dict[str, object]:
    ignored = gateway.events("CHN-1012")
    assert len(ignored) == 1, ignored
    enforced = [
        e
        for e in gateway.events("CHN-1005")
        if (e["connection"], e["channel"]) == (ignored[0]["connection"], ignored[0]["channel"])
    ]
    assert len(enforced) == 1
    waited = dt.datetime.fromisoformat(str(ignored[0]["ts"])) - dt.datetime.fromisoformat(
        str(enforced[0]["ts"])
    )
    assert waited >= dt.timedelta(milliseconds=TIMEOUT_MS)
    return ignored[0]


def test_confirm_client_ignoring_flow_is_closed_with_chn_1012(
    gateway_factory: Callable[..., RunningGateway],
    broker: Broker,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(flow_enforcement_timeout=TIMEOUT_MS)
    queue = unique_name("ignore-c")
    cleanup_queues.append(queue)
    _declare(gateway, queue)
    publisher = IgnoringConfirmPublisher(gateway.url, queue)
    publisher.start()
    assert publisher.done.wait(30), "publisher was not closed"
    reason = publisher.close_reason
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), reason
    assert reason.reply_code == 406
    assert "flow control ignored" in reason.reply_text
    _chn_1012_after_timeout(gateway)
    # The publishes the gateway forwarded are all in RabbitMQ, in order.
    expected = wait_for(
        lambda: (n := gateway.queue(queue)["messages"]) == _count(broker, queue) and n,
        what="gateway depth and RabbitMQ agreeing",
    )
    seqs = _sequences_in_rabbitmq(broker, queue)
    assert seqs == list(range(len(seqs)))
    assert len(seqs) == expected
    assert publisher.acked <= len(seqs) <= publisher.published


def _count(broker: Broker, queue: str) -> int:
    connection = broker.blocking_connection()
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def test_client_without_confirms_ignoring_flow_is_held_to_the_bound(
    gateway_factory: Callable[..., RunningGateway],
    broker: Broker,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(flow_enforcement_timeout=TIMEOUT_MS)
    queue = unique_name("ignore-n")
    cleanup_queues.append(queue)
    _declare(gateway, queue)
    connection = gateway.connect()
    channel = connection.channel()
    published = 0
    started = time.monotonic()
    closed: pika.exceptions.ChannelClosedByBroker | None = None
    # Bounded: the gateway must close the channel long before either limit.
    while published < 100_000 and time.monotonic() - started < 60:
        try:
            channel.basic_publish("", queue, _body(published))
        except pika.exceptions.ChannelClosedByBroker as exc:
            closed = exc
            break
        published += 1
    assert closed is not None, f"channel still open after {published} publishes"
    assert closed.reply_code == 406
    connection.close()
    _chn_1012_after_timeout(gateway)
    seqs = _sequences_in_rabbitmq(broker, queue)
    assert seqs == list(range(len(seqs)))
    assert STOP < len(seqs) <= STOP + 1 + BOUND, (len(seqs), BOUND)
    print(f"ignoring flow without confirms: {len(seqs)} accepted, bound {STOP + 1 + BOUND}")
