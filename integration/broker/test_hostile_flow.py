"""Clients that ignore flow control and try tricks to get past it.

The back-pressure allowance (2,000 messages or 1 MiB accepted past a block)
is per connection, summed over its channels and kept across channel close
and reopen; a connection that ignores flow again after a CHN-1012 is closed
(406).  Two raw-socket clients that never stop publishing (256-byte
messages, no confirms) are run against a gateway subprocess, each into a
queue with stop 20 and no consumer, while the queue's depth is sampled
straight from RabbitMQ:

* one reopens its channel after every CHN-1012 and goes on publishing;
* one publishes round robin on 50 channels (reopening any that is closed).

Each leaves the queue within stop + 2,000 + a small slack; the first one's
connection is closed with 406.
"""

from __future__ import annotations

import selectors
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pika
import pytest

from bench._gateway_common import GatewayProcess
from integration.broker._depth import DepthWatcher
from integration.broker._raw_amqp import (
    FRAME_BODY,
    FRAME_METHOD,
    RawConnection,
    content_header,
    frame,
    method,
    publish,
    shortstr,
)
from integration.conftest import Broker

STOP, RESUME = 20, 10
ALLOWANCE = 2_000
#: Messages a client may have in the gateway's read buffer when it is paused.
SLACK = 100
BODY = bytes(256)
ENFORCEMENT_TIMEOUT_MS = 1000

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway_process(broker: Broker) -> Iterator[GatewayProcess]:
    with GatewayProcess(
        broker.url,
        broker.management_url or "http://127.0.0.1:15672",
        extra_args=["--flow-enforcement-timeout", str(ENFORCEMENT_TIMEOUT_MS)],
    ) as gateway:
        yield gateway


@pytest.fixture
def flow_queue(
    gateway_process: GatewayProcess,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> str:
    """A queue with stop 20 / resume 10, declared through the gateway."""
    queue = unique_name("ignorer")
    cleanup_queues.append(queue)
    connection = pika.BlockingConnection(pika.URLParameters(gateway_process.url))
    try:
        connection.channel().queue_declare(
            queue, arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME}
        )
    finally:
        connection.close()
    return queue


@dataclass
class IgnorerOutcome:
    published: int = 0
    channel_closes: list[int] = field(default_factory=list)
    connection_close: int | None = None


def ignore_flow(port: int, queue: str, *, channels: int, duration: float) -> IgnorerOutcome:
    """Publish round robin on ``channels`` channels for ``duration`` seconds, never
    pausing: Flow is acknowledged and ignored, a closed channel is reopened at once.
    Stops early when the gateway closes the connection."""
    outcome = IgnorerOutcome()
    connection = RawConnection("127.0.0.1", port)
    connection.login()
    for number in range(1, channels + 1):
        connection.open_channel(number)
    sock = connection.sock
    sock.setblocking(False)
    open_channels = set(range(1, channels + 1))
    message = {
        number: publish(number, b"", queue.encode())
        + content_header(number, len(BODY), 0, b"")
        + frame(FRAME_BODY, number, BODY)
        for number in open_channels
    }
    out = bytearray()
    inbox = bytearray()
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    deadline = time.monotonic() + duration
    turn = 0
    try:
        while time.monotonic() < deadline and outcome.connection_close is None:
            while len(out) < 16_384 and open_channels:
                ordered = sorted(open_channels)
                number = ordered[turn % len(ordered)]
                turn += 1
                out += message[number]
                outcome.published += 1
            for _key, events in selector.select(timeout=0.05):
                if events & selectors.EVENT_WRITE and out:
                    try:
                        sent = sock.send(out)
                    except BlockingIOError:
                        sent = 0
                    del out[:sent]
                if events & selectors.EVENT_READ:
                    try:
                        chunk = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        return outcome
                    inbox += chunk
                    out += _answer_frames(inbox, open_channels, outcome)
    except OSError:
        pass  # reset by the gateway: the outcome so far stands
    finally:
        selector.close()
        connection.close()
    return outcome


def _answer_frames(inbox: bytearray, open_channels: set[int], outcome: IgnorerOutcome) -> bytes:
    """Consume whole frames from ``inbox``; return the bytes to send back."""
    reply = b""
    while len(inbox) >= 7:
        kind, channel, size = struct.unpack_from(">BHI", inbox)
        if len(inbox) < size + 8:
            break
        payload = bytes(inbox[7 : 7 + size])
        del inbox[: size + 8]
        if kind != FRAME_METHOD:
            continue
        ids = struct.unpack_from(">HH", payload)
        if ids == (20, 20):  # Channel.Flow: acknowledge it, then ignore it
            reply += method(channel, 20, 21, payload[4:5])
        elif ids == (20, 40):  # Channel.Close (CHN-1012): close-ok and reopen at once
            outcome.channel_closes.append(struct.unpack_from(">H", payload, 4)[0])
            open_channels.discard(channel)
            reply += method(channel, 20, 41) + method(channel, 20, 10, shortstr(b""))
        elif ids == (20, 11):  # Channel.Open-Ok
            open_channels.add(channel)
        elif ids == (10, 50):  # Connection.Close
            outcome.connection_close = struct.unpack_from(">H", payload, 4)[0]
            reply += method(0, 10, 51)
    return reply


def _run_ignorer(
    broker: Broker, gateway: GatewayProcess, queue: str, *, channels: int, duration: float
) -> tuple[IgnorerOutcome, int]:
    watcher = DepthWatcher(broker, queue)
    watcher.start()
    try:
        outcome = ignore_flow(gateway.port, queue, channels=channels, duration=duration)
    finally:
        deepest = watcher.finish()
    return outcome, deepest


def test_reopening_the_channel_after_chn_1012_keeps_the_queue_within_the_allowance(
    broker: Broker, gateway_process: GatewayProcess, flow_queue: str
) -> None:
    outcome, deepest = _run_ignorer(broker, gateway_process, flow_queue, channels=1, duration=15)

    assert outcome.published > STOP + ALLOWANCE + SLACK, "the client did not try hard enough"
    assert deepest <= STOP + ALLOWANCE + SLACK, (deepest, outcome)


def test_ignoring_flow_again_after_chn_1012_closes_the_connection_with_406(
    broker: Broker, gateway_process: GatewayProcess, flow_queue: str
) -> None:
    outcome, _deepest = _run_ignorer(broker, gateway_process, flow_queue, channels=1, duration=15)

    assert 406 in outcome.channel_closes, outcome
    assert outcome.connection_close == 406, outcome


def test_round_robin_on_50_channels_keeps_the_queue_within_the_allowance(
    broker: Broker, gateway_process: GatewayProcess, flow_queue: str
) -> None:
    outcome, deepest = _run_ignorer(broker, gateway_process, flow_queue, channels=50, duration=15)

    assert outcome.published > STOP + ALLOWANCE + SLACK, "the client did not try hard enough"
    assert deepest <= STOP + ALLOWANCE + SLACK, (deepest, outcome)
