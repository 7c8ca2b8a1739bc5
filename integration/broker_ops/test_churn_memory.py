"""Connection churn leaves the gateway's memory, descriptors and tasks flat.

A gateway process (the ``rabbitflow-broker`` command, with its collector
settings) relays thousands of short connections: each logs in, opens a
channel with confirms and publishes one message.  Two in three wait for
the confirm and close cleanly; one in three drops the socket with a reset
right after the publish, before its confirm, half of them with a second
channel open.  After a warm-up the gateway's resident memory may grow by at
most :data:`RSS_GROWTH_ALLOWED`, and its descriptors and asyncio tasks
(``GET /api/runtime``) return to what they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from integration.broker.conftest import wait_for
from integration.conftest import Broker
from rabbitflow_broker.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
WARM_UP = 1_000
CHURN = 5_000
#: Connections open at once (RabbitMQ is shared: keep this small).
CONCURRENCY = 8
RSS_GROWTH_ALLOWED = 2 * 1024 * 1024

_HEADER = b"AMQP\x00\x00\x09\x01"
_START_OK = (10, 11)


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def _method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return _frame(1, channel, struct.pack(">HH", class_id, method_id) + arguments)


def _shortstr(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def _longstr(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


_LOGIN = _longstr(b"\0guest\0guest")
_START_OK_FRAME = _method(
    0, 10, 11, _longstr(b"") + _shortstr(b"PLAIN") + _LOGIN + _shortstr(b"en_US")
)
_TUNE_OK_OPEN = _method(0, 10, 31, struct.pack(">HIH", 2047, 131072, 0)) + _method(
    0, 10, 40, _shortstr(b"/") + _shortstr(b"") + b"\x00"
)


def _channel_open(channel: int) -> bytes:
    return _method(channel, 20, 10, _shortstr(b""))


def _confirm_select(channel: int) -> bytes:
    return _method(channel, 85, 10, b"\x00")


def _publish(channel: int, queue: bytes, body: bytes) -> bytes:
    return (
        _method(channel, 60, 40, struct.pack(">H", 0) + _shortstr(b"") + _shortstr(queue) + b"\x00")
        + _frame(2, channel, struct.pack(">HHQH", 60, 0, len(body), 0))
        + _frame(3, channel, body)
    )


_CLOSE = _method(0, 10, 50, struct.pack(">H", 200) + _shortstr(b"bye") + struct.pack(">HH", 0, 0))


async def _read_method(reader: asyncio.StreamReader) -> tuple[int, int, int]:
    """(channel, class, method) of the next method frame (heartbeats skipped)."""
    while True:
        kind, channel, size = struct.unpack(">BHI", await reader.readexactly(7))
        payload = await reader.readexactly(size + 1)
        if kind == 1:
            class_id, method_id = struct.unpack_from(">HH", payload)
            return channel, class_id, method_id


async def _expect(reader: asyncio.StreamReader, wanted: tuple[int, int]) -> None:
    _channel, class_id, method_id = await _read_method(reader)
    if (class_id, method_id) != wanted:
        raise AssertionError(f"expected method {wanted}, got {(class_id, method_id)}")


async def _one_connection(port: int, queue: bytes, number: int) -> bool:
    """One client's life; returns whether its message was confirmed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_HEADER)
        await _expect(reader, (10, 10))  # Start
        writer.write(_START_OK_FRAME)
        await _expect(reader, (10, 30))  # Tune
        writer.write(_TUNE_OK_OPEN)
        await _expect(reader, (10, 41))  # Open-Ok
        writer.write(_channel_open(1) + _confirm_select(1))
        await _expect(reader, (20, 11))
        await _expect(reader, (85, 11))
        abrupt = number % 3 == 0
        if abrupt and number % 2 == 0:
            writer.write(_channel_open(2))  # a second channel, open when the socket drops
            await _expect(reader, (20, 11))
        writer.write(_publish(1, queue, b"m%d" % number))
        if abrupt:
            # Unconfirmed publish, open channels: drop the socket with a reset.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        await _expect(reader, (60, 80))  # the confirm
        writer.write(_CLOSE)
        await _expect(reader, (10, 51))
        return True
    finally:
        writer.close()


async def _churn(port: int, queue: bytes, start: int, count: int) -> int:
    """``count`` connections, :data:`CONCURRENCY` at a time; returns confirms."""
    numbers = iter(range(start, start + count))
    confirmed = 0

    async def worker() -> None:
        nonlocal confirmed
        for number in numbers:
            done = await asyncio.wait_for(_one_connection(port, queue, number), 30)
            confirmed += done

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return confirmed


def _rss(pid: int) -> int:
    """The process's resident memory (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _runtime(admin_port: int) -> dict[str, object]:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{admin_port}/api/runtime", timeout=10
    ) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


@pytest.fixture
def churn_queue(broker: Broker, unique_name: Callable[[str], str]) -> Iterator[str]:
    name = unique_name("churn")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        connection.channel().queue_declare(name)
    yield name
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        connection.channel().queue_delete(name)


@pytest.mark.slow
def test_churn_leaves_memory_fds_and_tasks_flat(
    broker: Broker, churn_queue: str, tmp_path: Path
) -> None:
    port, admin_port = free_port(), free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
    log = tmp_path / "gateway.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                BROKER_CLI,
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{admin_port}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url or "http://127.0.0.1:15672",
            ],
            stderr=stderr,
            env=environ,
        )
    try:
        wait_for(lambda: "gateway ready" in log.read_text(), timeout=30, what="gateway ready")
        queue = churn_queue.encode()
        confirmed = asyncio.run(_churn(port, queue, 0, WARM_UP))
        wait_for(lambda: _runtime(admin_port)["connections"] == 0, timeout=30, what="warm-up gone")
        pid = process.pid
        before = _runtime(admin_port)
        rss_before, fds_before = _rss(pid), _fds(pid)
        confirmed += asyncio.run(_churn(port, queue, WARM_UP, CHURN))
        wait_for(lambda: _runtime(admin_port)["connections"] == 0, timeout=30, what="churn gone")
        # (<=: the baseline may count an admin request's socket not yet closed)
        wait_for(
            lambda: _fds(pid) <= fds_before, timeout=10, what=f"descriptors back to {fds_before}"
        )
        after = _runtime(admin_port)
        growth = _rss(pid) - rss_before
        # Shown with -s: the figures behind the assertions.
        print(f"RSS +{growth / 1024:.0f} KiB, fds {fds_before}->{_fds(pid)}")
        print(f"runtime before {before}\nruntime after {after}")
        assert after["tasks"] == before["tasks"], (before, after)
        assert growth <= RSS_GROWTH_ALLOWED, (
            f"RSS grew by {growth / 1024:.0f} KiB over {CHURN} connections"
        )
        # Every clean client's message was confirmed, and is in the queue.
        assert confirmed == sum(1 for n in range(WARM_UP + CHURN) if n % 3)
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
            depth = connection.channel().queue_declare(churn_queue, passive=True)
        assert depth.method.message_count >= confirmed
    finally:
        process.terminate()
        process.wait(timeout=15)
