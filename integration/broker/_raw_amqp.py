"""A raw-socket AMQP 0-9-1 client for black-box tests: frames built by hand.

pika and pamqp cannot send a malformed frame, a timestamp beyond year 9999
or a short string that is not UTF-8; this client sends exactly the bytes it
is given and reads the answer frame by frame.

API:

``frame(kind, channel, payload, *, end=0xCE) -> bytes``, ``method(channel, class_id,
method_id, arguments) -> bytes``
    One frame; ``end`` lets a test send a wrong frame-end octet.
``shortstr``, ``longstr``, ``u8``/``u16``/``u32``/``u64``, ``table(entries)``
    Argument encoders over raw bytes (``table`` takes already-encoded
    ``(name, type_octet_and_value)`` pairs, so any field type can be built).
``select_confirms``, ``publish_confirmed``, ``basic_get``, ``Delivered``
    One confirmed publish with raw property bytes; Basic.Get returning the
    property bytes and body as delivered.
``RawConnection(host, port)``
    ``send(data)``, ``read_frame(deadline)``, ``start()`` (protocol header
    in, Connection.Start out), ``login()`` (Start-Ok, Tune, Tune-Ok, Open),
    ``open_channel(n)``, ``answer(timeout)`` (the first close, sentinel reply
    or EOF), ``close()``.
``Answer``, ``Frame``
    What came back.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
#: How long a close may still come after the sentinel's reply.
SENTINEL_GRACE_S = 0.5

CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)


def u8(value: int) -> bytes:
    return struct.pack(">B", value)


def u16(value: int) -> bytes:
    return struct.pack(">H", value)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def shortstr(value: bytes) -> bytes:
    return u8(len(value)) + value


def longstr(value: bytes) -> bytes:
    return u32(len(value)) + value


def table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A field table of ``(name, type octet + encoded value)`` entries."""
    body = b"".join(shortstr(name) + value for name, value in entries)
    return longstr(body)


def frame(kind: int, channel: int, payload: bytes, *, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + u8(end)


def method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, u16(class_id) + u16(method_id) + arguments)


def content_header(channel: int, body_size: int, flags: int, properties: bytes) -> bytes:
    """A Basic content header frame with raw ``properties`` for ``flags``."""
    return frame(FRAME_HEADER, channel, u16(60) + u16(0) + u64(body_size) + u16(flags) + properties)


def publish(channel: int, exchange: bytes, routing_key: bytes, *, mandatory: bool = False) -> bytes:
    return method(
        channel, 60, 40, u16(0) + shortstr(exchange) + shortstr(routing_key) + u8(int(mandatory))
    )


@dataclass(frozen=True)
class Frame:
    kind: int
    channel: int
    payload: bytes

    @property
    def method_id(self) -> tuple[int, int] | None:
        if self.kind != FRAME_METHOD or len(self.payload) < 4:
            return None
        class_id, method_no = struct.unpack_from(">HH", self.payload)
        return class_id, method_no


@dataclass(frozen=True)
class Answer:
    """The first thing a peer answered: ``kind`` is ``connection.close``,
    ``channel.close``, ``ok`` (the sentinel's reply), ``protocol-header``, ``eof``
    or ``timeout``; for closes, the reply code, the offending class and method
    ids and the reply text (informative, not compared)."""

    kind: str
    code: int = 0
    class_id: int = 0
    method_id: int = 0
    text: str = ""

    def key(self) -> tuple[str, int, int, int]:
        return self.kind, self.code, self.class_id, self.method_id


def _decode_close(payload: bytes) -> tuple[int, str, int, int]:
    code = struct.unpack_from(">H", payload, 4)[0]
    length = payload[6]
    text = payload[7 : 7 + length].decode("utf-8", "replace")
    class_id, method_no = struct.unpack_from(">HH", payload, 7 + length)
    return code, text, class_id, method_no


class RawConnection:
    """One TCP connection speaking raw AMQP bytes."""

    def __init__(self, host: str, port: int, *, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self.frame_max = 0
        self.eof = False

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self._buffer += chunk
        return True

    def read_raw(self, size: int, deadline: float) -> bytes | None:
        """Exactly ``size`` bytes, or None at EOF or the deadline."""
        while len(self._buffer) < size:
            if not self._fill(deadline):
                return None
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def read_frame(self, deadline: float, *, skip_heartbeats: bool = True) -> Frame | None:
        """The next frame, or None at EOF or the deadline."""
        while True:
            header = self.read_raw(7, deadline)
            if header is None:
                return None
            kind, channel, size = struct.unpack(">BHI", header)
            rest = self.read_raw(size + 1, deadline)
            if rest is None:
                return None
            if rest[-1] != FRAME_END:
                raise AssertionError(f"peer sent a frame ending with {rest[-1]:#x}")
            if kind == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return Frame(kind, channel, rest[:-1])

    def expect_method(self, wanted: tuple[int, int], deadline: float) -> Frame:
        got = self.read_frame(deadline)
        if got is None or got.method_id != wanted:
            detail = "nothing" if got is None else f"{got.method_id} {got.payload[:80]!r}"
            raise AssertionError(f"expected method {wanted}, got {detail}")
        return got

    # -- handshake ---------------------------------------------------------------

    def start(self, *, timeout: float = 10.0) -> Frame:
        """Send the protocol header; return Connection.Start."""
        self.send(PROTOCOL_HEADER)
        return self.expect_method(CONNECTION_START, time.monotonic() + timeout)

    @staticmethod
    def start_ok(
        user: bytes = b"guest",
        password: bytes = b"guest",
        client_properties: bytes | None = None,
    ) -> bytes:
        """A Connection.Start-Ok frame (PLAIN) on channel 0."""
        properties = table([]) if client_properties is None else client_properties
        return method(
            0,
            10,
            11,
            properties
            + shortstr(b"PLAIN")
            + longstr(b"\x00" + user + b"\x00" + password)
            + shortstr(b"en_US"),
        )

    def tune(self, *, timeout: float = 10.0) -> Frame:
        """Send Start-Ok; return Connection.Tune (remembering frame-max)."""
        self.send(self.start_ok())
        tune = self.expect_method(CONNECTION_TUNE, time.monotonic() + timeout)
        self.frame_max = struct.unpack_from(">I", tune.payload, 6)[0]
        return tune

    def open(self, vhost: bytes = b"/", *, timeout: float = 10.0) -> None:
        """Send Tune-Ok (no heartbeats) and Connection.Open; wait for Open-Ok."""
        self.send(method(0, 10, 31, u16(2047) + u32(self.frame_max) + u16(0)))
        self.send(method(0, 10, 40, shortstr(vhost) + shortstr(b"") + u8(0)))
        self.expect_method(CONNECTION_OPEN_OK, time.monotonic() + timeout)

    def login(self, vhost: bytes = b"/", *, timeout: float = 10.0) -> None:
        """The whole handshake as guest: Start ... Open-Ok."""
        self.start(timeout=timeout)
        self.tune(timeout=timeout)
        self.open(vhost, timeout=timeout)

    def open_channel(self, channel: int, *, timeout: float = 10.0) -> None:
        self.send(method(channel, 20, 10, shortstr(b"")))
        self.expect_method(CHANNEL_OPEN_OK, time.monotonic() + timeout)

    # -- answers -------------------------------------------------------------------

    def answer(self, *, timeout: float = 10.0, sentinel_channel: int | None = None) -> Answer:
        """The first answer that matters after a test's bytes.

        Frames other than a close and the sentinel's reply (Basic.Qos-Ok on
        ``sentinel_channel``, sent by the caller after its bytes) are skipped;
        ``ok`` means the sentinel was answered and no close followed within
        ``SENTINEL_GRACE_S``.
        A close is acknowledged (Close-Ok) as a well-behaved client would.
        """
        deadline = time.monotonic() + timeout
        accepted = False
        while True:
            got = self.read_frame(deadline)
            if got is None:
                if accepted:
                    return Answer("ok")
                return Answer("eof" if self.eof else "timeout")
            ids = got.method_id
            if ids == CONNECTION_CLOSE:
                code, text, class_id, method_no = _decode_close(got.payload)
                with contextlib.suppress(OSError):
                    self.send(method(0, *CONNECTION_CLOSE_OK))
                return Answer("connection.close", code, class_id, method_no, text)
            if ids == CHANNEL_CLOSE:
                code, text, class_id, method_no = _decode_close(got.payload)
                with contextlib.suppress(OSError):
                    self.send(method(got.channel, *CHANNEL_CLOSE_OK))
                return Answer("channel.close", code, class_id, method_no, text)
            if ids == BASIC_QOS_OK and got.channel == sentinel_channel and not accepted:
                # Another channel's process may still be failing on the bytes: its
                # close can follow the sentinel's reply, so wait a little for one.
                accepted = True
                deadline = min(deadline, time.monotonic() + SENTINEL_GRACE_S)

    def protocol_answer(self, *, timeout: float = 10.0) -> Answer:
        """After a bad protocol header: the server's own header, or a close/EOF."""
        deadline = time.monotonic() + timeout
        head = self.read_raw(8, deadline)
        if head is None:
            return Answer("eof" if self.eof else "timeout")
        if head.startswith(b"AMQP"):
            return Answer("protocol-header", text=head.hex())
        self._buffer = head + self._buffer
        return self.answer(timeout=max(0.1, deadline - time.monotonic()))


def qos_sentinel(channel: int) -> bytes:
    """Basic.Qos(prefetch 0): its Qos-Ok shows everything before it was accepted."""
    return method(channel, 60, 10, u32(0) + u16(0) + u8(0))


# -- messages ----------------------------------------------------------------------------

CONFIRM_SELECT_OK = (85, 11)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)


@dataclass(frozen=True)
class Delivered:
    """A message as it came back: the raw property flags + property bytes, and the body."""

    properties: bytes
    body: bytes


def select_confirms(connection: RawConnection, channel: int, *, timeout: float = 10.0) -> None:
    connection.send(method(channel, 85, 10, u8(0)))
    connection.expect_method(CONFIRM_SELECT_OK, time.monotonic() + timeout)


def publish_confirmed(
    connection: RawConnection,
    channel: int,
    exchange: bytes,
    routing_key: bytes,
    *,
    properties: bytes,
    body: bytes,
    timeout: float = 10.0,
) -> Answer:
    """Publish one message on a confirm-mode channel; ``ok`` once it is acked.

    ``properties`` is the property-flags word followed by the property values,
    exactly as they go into the content header.  Returns the close (or
    ``nack``/``eof``/``timeout``) instead when the message is refused.
    """
    header = frame(FRAME_HEADER, channel, u16(60) + u16(0) + u64(len(body)) + properties)
    connection.send(
        publish(channel, exchange, routing_key) + header + frame(FRAME_BODY, channel, body)
    )
    deadline = time.monotonic() + timeout
    while True:
        got = connection.read_frame(deadline)
        if got is None:
            return Answer("eof" if connection.eof else "timeout")
        ids = got.method_id
        if ids == BASIC_ACK and got.channel == channel:
            return Answer("ok")
        if ids == BASIC_NACK and got.channel == channel:
            return Answer("nack")
        if ids in (CONNECTION_CLOSE, CHANNEL_CLOSE):
            code, text, class_id, method_no = _decode_close(got.payload)
            kind = "connection.close" if ids == CONNECTION_CLOSE else "channel.close"
            return Answer(kind, code, class_id, method_no, text)


def basic_get(
    connection: RawConnection, channel: int, queue: bytes, *, timeout: float = 10.0
) -> Delivered | None:
    """Basic.Get with no-ack; the message, or None when the queue is empty."""
    connection.send(method(channel, 60, 70, u16(0) + shortstr(queue) + u8(1)))
    deadline = time.monotonic() + timeout
    reply = connection.read_frame(deadline)
    if reply is not None and reply.method_id == BASIC_GET_EMPTY:
        return None
    if reply is None or reply.method_id != BASIC_GET_OK:
        raise AssertionError(f"expected Get-Ok or Get-Empty, got {reply}")
    header = connection.read_frame(deadline)
    if header is None or header.kind != FRAME_HEADER:
        raise AssertionError(f"expected a content header, got {header}")
    size = struct.unpack_from(">Q", header.payload, 4)[0]
    body = b""
    while len(body) < size:
        part = connection.read_frame(deadline)
        if part is None or part.kind != FRAME_BODY:
            raise AssertionError(f"expected a body frame, got {part}")
        body += part.payload
    return Delivered(header.payload[12:], body)
