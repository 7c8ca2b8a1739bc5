"""Gateway memory under connection churn: RSS of a gateway process as clients come and go.

Each client opens a connection through the gateway, logs in, opens a
channel with publisher confirms and publishes one 16-byte message.  Two in
three wait for the confirm and close cleanly; one in three drops the socket
with a TCP reset right after the publish, before its confirm arrives (every
other one of those with a second channel open).  ``--concurrency`` clients
run at once (8), so RabbitMQ never holds more than that many of these
connections.

The gateway runs as a ``rabbitflow-broker`` subprocess on free ports, as in
``bench/gateway_overhead.py`` (``--gateway-src [LABEL=]TREE``, repeatable,
runs it from another checkout; ``--event-loop`` picks its loop).  After
every ``--sample-every`` connections (3,000) the bench waits (up to 10 s)
until the gateway's descriptors are back to their count at start, then
reads its resident memory (``VmRSS`` of ``/proc/<pid>/status``).  Printed per
gateway: the RSS after each sample, and the growth per connection from the
first sample (after one round of warm-up) to the last, in bytes.

Run: ``.venv/bin/python bench/connection_churn.py [--connections N]``
(default 24,000; ``RABBITMQ_URL`` / ``--url`` and ``--management-url``
pick the broker).  Memory does not depend on the machine's load; the time
taken does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DEFAULT_URL, scratch_queue
from bench._gateway_common import BenchError, GatewayProcess

__all__ = ["CONCURRENCY", "churn", "rss_bytes"]

#: Clients connected at once.
CONCURRENCY = 8

_HEADER = b"AMQP\x00\x00\x09\x01"


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def _method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return _frame(1, channel, struct.pack(">HH", class_id, method_id) + arguments)


def _shortstr(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def _longstr(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


_START_OK = _method(
    0,
    10,
    11,
    _longstr(b"") + _shortstr(b"PLAIN") + _longstr(b"\0guest\0guest") + _shortstr(b"en_US"),
)
_TUNE_OK_OPEN = _method(0, 10, 31, struct.pack(">HIH", 2047, 131072, 0)) + _method(
    0, 10, 40, _shortstr(b"/") + _shortstr(b"") + b"\x00"
)
_CLOSE = _method(0, 10, 50, struct.pack(">H", 200) + _shortstr(b"bye") + struct.pack(">HH", 0, 0))


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


async def _expect(reader: asyncio.StreamReader, wanted: tuple[int, int]) -> None:
    """Read up to the next method frame (heartbeats skipped); it must be ``wanted``."""
    while True:
        kind, _channel, size = struct.unpack(">BHI", await reader.readexactly(7))
        payload = await reader.readexactly(size + 1)
        if kind == 1:
            got = struct.unpack_from(">HH", payload)
            if got != wanted:
                raise BenchError(f"expected AMQP method {wanted}, got {got}")
            return


async def _client(port: int, queue: bytes, number: int) -> bool:
    """One client's life (abrupt when ``number`` is a multiple of 3);
    returns whether its message was confirmed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_HEADER)
        await _expect(reader, (10, 10))  # Start
        writer.write(_START_OK)
        await _expect(reader, (10, 30))  # Tune
        writer.write(_TUNE_OK_OPEN)
        await _expect(reader, (10, 41))  # Open-Ok
        writer.write(_channel_open(1) + _confirm_select(1))
        await _expect(reader, (20, 11))
        await _expect(reader, (85, 11))
        abrupt = number % 3 == 0
        if abrupt and number % 2 == 0:
            writer.write(_channel_open(2))  # open when the socket drops
            await _expect(reader, (20, 11))
        writer.write(_publish(1, queue, b"churn-%010d" % number))
        if abrupt:  # a reset, the publish unconfirmed
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        await _expect(reader, (60, 80))  # Basic.Ack: the confirm
        writer.write(_CLOSE)
        await _expect(reader, (10, 51))
        return True
    finally:
        writer.close()


async def churn(
    port: int, queue: str, start: int, count: int, *, concurrency: int = CONCURRENCY
) -> int:
    """Run clients ``start`` .. ``start + count - 1`` against the gateway at
    ``port``, ``concurrency`` at a time; returns how many were confirmed.

    Raises:
        BenchError: the gateway answered with something unexpected.
    """
    numbers = iter(range(start, start + count))
    confirmed = 0
    name = queue.encode()

    async def worker() -> None:
        nonlocal confirmed
        for number in numbers:
            done = await asyncio.wait_for(_client(port, name, number), 30)
            confirmed += done

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return confirmed


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (``VmRSS``), in bytes.

    Raises:
        BenchError: ``/proc`` does not say.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for process {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_ready(admin_port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/api/ready", timeout=5):
                return
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() > deadline:
                raise BenchError(f"gateway not ready within 60 s: {exc}") from exc
            time.sleep(0.2)


def _wait_fds(pid: int, baseline: int) -> int:
    """Wait (up to 10 s) until the gateway has no more descriptors open than
    at ``baseline``; returns the count (printed: the management API's
    connection pool may hold one more for a while)."""
    deadline = time.monotonic() + 10
    while (count := _fds(pid)) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def run(
    gateway: GatewayProcess, url: str, connections: int, every: int, concurrency: int
) -> list[tuple[int, int, int]]:
    """Churn through ``gateway``; returns (connections so far, RSS, fds) samples."""
    samples: list[tuple[int, int, int]] = []
    with gateway, scratch_queue(url, "churn") as queue:
        _wait_ready(gateway.admin_port)
        baseline = _fds(gateway.pid)
        done = 0
        while done < connections:
            step = min(every, connections - done)
            asyncio.run(churn(gateway.port, queue, done, step, concurrency=concurrency))
            done += step
            fds = _wait_fds(gateway.pid, baseline)
            samples.append((done, rss_bytes(gateway.pid), fds))
            mib = samples[-1][1] / 2**20
            print(f"  {done:>7} connections: RSS {mib:6.1f} MiB, {fds} fds", flush=True)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=24_000, help="per gateway (24000)")
    parser.add_argument("--sample-every", type=int, default=3_000, help="connections (3000)")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="clients at once (8)")
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument("--management-url", default="http://127.0.0.1:15672")
    parser.add_argument("--event-loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument(
        "--gateway-src",
        action="append",
        default=[],
        metavar="[LABEL=]TREE",
        help="run a gateway from this source tree (repeatable; default: this tree)",
    )
    args = parser.parse_args(argv)
    sources: list[tuple[str, Path | None]] = []
    for text in args.gateway_src:
        label, sep, tree = text.partition("=")
        path = Path(tree if sep else text).expanduser()
        sources.append((label if sep else path.resolve().name, path))
    if not sources:
        sources = [("this tree", None)]
    results: dict[str, list[tuple[int, int, int]]] = {}
    try:
        for label, source in sources:
            gateway = GatewayProcess(
                args.url, args.management_url, event_loop=args.event_loop, source=source
            )
            print(f"{label}: {gateway.imported_from}", flush=True)
            results[label] = run(
                gateway, args.url, args.connections, args.sample_every, args.concurrency
            )
    except BenchError as exc:
        print(f"connection_churn: {exc}", file=sys.stderr)
        return 1
    print()
    for label, samples in results.items():
        series = " -> ".join(f"{rss / 2**20:.1f}" for _, rss, _ in samples)
        (first_n, first_rss, _), (last_n, last_rss, _) = samples[0], samples[-1]
        per = (last_rss - first_rss) / (last_n - first_n) if last_n > first_n else 0.0
        print(f"{label}: RSS MiB {series}; {per:+.0f} bytes per connection after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
