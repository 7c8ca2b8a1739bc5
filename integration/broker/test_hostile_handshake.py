"""Hostile clients before login: what they may cost the gateway.

The gateway runs as a ``rabbitflow-broker`` subprocess (so its memory and
its event loop are its own) with a short ``--handshake-timeout``.  Checked:

* four unauthenticated connections each sending a 928 KB
  ``Connection.Start-Ok`` whose client-properties table holds 116,000 tiny
  entries are each closed by the gateway, and a normal client's connect,
  declare, confirmed publish and get succeed beside them (how long that
  takes is printed, not asserted: it depends on the machine's load);
* 300 unauthenticated connections each holding a partial 1 MB frame grow
  the gateway's memory by at most 64 MiB, and every one of them is closed
  within the handshake timeout;
* a client that stops in the middle of its handshake is closed by the
  gateway's own handshake timeout.

(Frames over 4096 bytes before Tune-Ok and channel methods on channel 0 are
cases of the error-code differential, ``test_error_codes.py``.)
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from bench._gateway_common import GatewayProcess
from integration.broker._raw_amqp import PROTOCOL_HEADER, RawConnection, table
from integration.conftest import Broker

HANDSHAKE_TIMEOUT_S = 2.0
#: How late after the handshake timeout a close may come: the gateway reads
#: 300 MB of partial frames first, and on a loaded machine (two test workers
#: and other work on two cores) 3 s was seen to be too little.  Without the
#: timeout the connections would stay open for good.
CLOSE_SLACK_S = 10.0
MIB = 1024 * 1024


@pytest.fixture
def gateway_process(broker: Broker) -> Iterator[GatewayProcess]:
    with GatewayProcess(
        broker.url,
        broker.management_url or "http://127.0.0.1:15672",
        extra_args=["--handshake-timeout", str(int(HANDSHAKE_TIMEOUT_S * 1000))],  # ms
    ) as gateway:
        yield gateway


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _start_ok_bomb() -> bytes:
    """A 928 KB Start-Ok: 116,000 client properties of 8 bytes each (5-byte name, bool)."""
    entries = [(b"%05x" % i, b"t\x01") for i in range(116_000)]
    return RawConnection.start_ok(client_properties=table(entries))


def _send_quietly(sock: socket.socket, data: bytes, done: threading.Event) -> None:
    """Send all of ``data`` unless the gateway closes first; set ``done`` either way."""
    try:
        sock.sendall(data)
    except OSError:
        pass
    finally:
        done.set()


def _wait_closed(sock: socket.socket, deadline: float) -> bool:
    """Read (and drop) whatever arrives until the peer closes; False at the deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True


def _normal_client_round_trip(url: str, queue: str) -> float:
    """Seconds for connect, declare, confirmed publish and get through ``url``."""
    started = time.monotonic()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"normal client")
        method_frame, _properties, body = channel.basic_get(queue, auto_ack=True)
        elapsed = time.monotonic() - started
    finally:
        connection.close()
    assert method_frame is not None
    assert body == b"normal client"
    return elapsed


def test_start_ok_bombs_are_closed_and_a_normal_client_is_served(
    gateway_process: GatewayProcess,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    bomb = _start_ok_bomb()
    assert 900_000 < len(bomb) < 960_000
    bombers: list[tuple[RawConnection, threading.Event]] = []
    try:
        for _ in range(4):
            connection = RawConnection("127.0.0.1", gateway_process.port)
            bombers.append((connection, threading.Event()))
            connection.start()
        for connection, sent in bombers:
            threading.Thread(
                target=_send_quietly, args=(connection.sock, bomb, sent), daemon=True
            ).start()
        for _connection, sent in bombers:
            assert sent.wait(30), "a bomb could not be sent in 30 s"
        queue = unique_name("bomb")
        cleanup_queues.append(queue)

        started = time.monotonic()
        try:
            elapsed = _normal_client_round_trip(gateway_process.url, queue)
        except pika.exceptions.AMQPError as exc:
            waited = time.monotonic() - started
            pytest.fail(f"normal client failed after {waited:.1f} s beside the bombs: {exc!r}")
        # How long it took depends on the machine's load: shown, not asserted.
        print(f"normal client round trip beside 4 Start-Ok bombs: {elapsed:.3f} s")

        # The gateway refused each bomb at its frame header (a frame over
        # PRE_LOGIN_FRAME_MAX before Tune-Ok), without reading it whole.
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S
        still_open = [
            number
            for number, (connection, _sent) in enumerate(bombers)
            if not _wait_closed(connection.sock, deadline)
        ]
        assert still_open == [], f"bomb connections {still_open} still open"
    finally:
        for connection, _sent in bombers:
            connection.close()


def _hold_partial_frames(port: int, count: int, deadline: float) -> list[socket.socket]:
    """``count`` connections, each sending the protocol header and all but the last byte
    of a 1 MB frame (as far as the gateway reads it before closing); returns the sockets."""
    frame_size = MIB
    partial = PROTOCOL_HEADER + struct.pack(">BHI", 1, 0, frame_size) + bytes(frame_size)
    sockets: list[socket.socket] = []
    pending: dict[socket.socket, memoryview] = {}
    selector = selectors.DefaultSelector()
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
        sockets.append(sock)
        pending[sock] = memoryview(partial)
        selector.register(sock, selectors.EVENT_WRITE)
    while pending and time.monotonic() < deadline:
        for key, _events in selector.select(timeout=0.2):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                sent = ready.send(pending[ready][:262_144])
            except BlockingIOError:
                continue
            except OSError:
                sent = len(pending[ready])  # closed by the gateway: nothing more to send
            pending[ready] = pending[ready][sent:]
            if not pending[ready]:
                del pending[ready]
                selector.unregister(ready)
    selector.close()
    return sockets


def test_partial_megabyte_frames_before_login_grow_memory_at_most_64_mib(
    gateway_process: GatewayProcess,
) -> None:
    pid = gateway_process.pid
    before_kib = _status_kib(pid, "VmRSS")
    sockets = _hold_partial_frames(gateway_process.port, 300, time.monotonic() + 30)
    try:
        # The peak (VmHWM) is read once the gateway has had the whole handshake timeout
        # to read and drop these connections, so every byte it took is counted.
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S
        for sock in sockets:
            _wait_closed(sock, deadline)
        peak_kib = _status_kib(pid, "VmHWM")
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    grown_mib = (peak_kib - before_kib) / 1024
    assert grown_mib <= 64, f"gateway memory grew by {grown_mib:.0f} MiB for 300 partial frames"


def test_partial_megabyte_frames_before_login_are_closed_within_the_handshake_timeout(
    gateway_process: GatewayProcess,
) -> None:
    started = time.monotonic()
    sockets = _hold_partial_frames(gateway_process.port, 300, started + 30)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S
    try:
        still_open = sum(1 for sock in sockets if not _wait_closed(sock, deadline))
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    assert still_open == 0, f"{still_open} of 300 connections still open after the timeout"


def test_a_stalled_handshake_is_closed_by_the_handshake_timeout(
    gateway_process: GatewayProcess,
) -> None:
    with RawConnection("127.0.0.1", gateway_process.port) as connection:
        connection.start()
        start_ok = RawConnection.start_ok()
        connection.send(start_ok[: len(start_ok) // 2])
        stalled_at = time.monotonic()

        closed = _wait_closed(connection.sock, stalled_at + HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S)

        elapsed = time.monotonic() - stalled_at
    assert closed, f"still open {elapsed:.1f} s after stalling (handshake timeout 2 s)"
    assert elapsed >= HANDSHAKE_TIMEOUT_S * 0.8, f"closed after {elapsed:.2f} s, before the timeout"
