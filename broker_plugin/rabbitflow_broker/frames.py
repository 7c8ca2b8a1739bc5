"""AMQP 0-9-1 frames over bytes (pure, sans-IO).

The relay forwards the bytes it received, never a re-encoding of them, so
this module only *splits* a byte stream into frames and decodes the few
methods the gateway has to understand:

* :class:`FrameReader` turns chunks of bytes into :class:`FrameRef` offsets
  into one buffer, so the caller can forward runs of frames with one slice;
* :class:`ContentTracker` checks the method / content-header / body order of
  one direction and tells the size of each message;
* hot methods (``Basic.Publish``, ``Basic.Deliver``, acks) have small hand
  decoders; the rest go through pamqp;
* :func:`encode_method` marshals the frames the gateway sends itself.

Protocol violations raise :class:`FrameError` carrying the AMQP reply code
to close the connection with.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from pamqp import base, commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from rabbitflow_broker.errors import ProtocolError

__all__ = [
    "COMMAND_INVALID",
    "CONTENT_METHODS",
    "FRAME_BODY",
    "FRAME_ERROR",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "NOT_ALLOWED",
    "PRECONDITION_FAILED",
    "PROTOCOL_HEADER",
    "UNEXPECTED_FRAME",
    "AckMethod",
    "ContentHeaderInfo",
    "ContentTracker",
    "DeliverMethod",
    "FrameError",
    "FrameReader",
    "FrameRef",
    "PublishMethod",
    "decode_ack",
    "decode_content_header",
    "decode_deliver",
    "decode_method",
    "decode_publish",
    "encode_method",
    "method_id",
    "whole_message",
]

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE

# AMQP reply codes the gateway uses.
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
NOT_ALLOWED: Final = 530
UNEXPECTED_FRAME: Final = 505

_FRAME_HEADER = struct.Struct(">BHI")
_IDS = struct.Struct(">HH")
_U64 = struct.Struct(">Q")
_CONTENT_HEADER = struct.Struct(">HHQH")

#: (class_id, method_id) of methods followed by a content header and bodies.
CONTENT_METHODS: Final = frozenset({(60, 40), (60, 50), (60, 60), (60, 71)})

#: Largest frame accepted before ``Connection.Tune`` settles frame-max.
_DEFAULT_MAX_FRAME = 1 << 20
_HEADERS_FLAG = 0x2000


class FrameError(ProtocolError):
    """A protocol violation; ``code`` is the AMQP reply code to close with."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class FrameRef(NamedTuple):
    """One frame inside a buffer: ``buffer[start:end]`` is the whole frame."""

    kind: int
    channel: int
    start: int
    end: int

    def payload(self, buffer: bytes) -> bytes:
        """The frame payload (without the 7-byte header and the end octet)."""
        return buffer[self.start + 7 : self.end - 1]


class FrameReader:
    """Splits one direction of an AMQP connection into frames.

    ``expect_protocol_header`` is true on the client side: the first 8 bytes
    must be ``AMQP 0 0 9 1``.  :meth:`feed` returns the buffer the returned
    frame offsets point into; bytes of an incomplete frame stay inside the
    reader until the rest arrives.
    """

    def __init__(self, *, expect_protocol_header: bool = False) -> None:
        self._pending = b""
        self._unread = False
        self._need_header = expect_protocol_header
        self.max_frame_size = _DEFAULT_MAX_FRAME

    @property
    def holding(self) -> bool:
        """True while bytes handed back with :meth:`unread` wait to be parsed."""
        return self._unread

    def unread(self, data: bytes) -> None:
        """Give back bytes of complete frames returned by :meth:`feed` but not
        handled; the next :meth:`feed` (``b""`` will do) returns them first."""
        if data:
            self._pending = data + self._pending
            self._unread = True

    def feed(self, data: bytes) -> tuple[bytes, list[FrameRef]]:
        """Add bytes; return (buffer, complete frames in it).

        A protocol header, when expected, is reported as a frame of kind 0.

        Raises:
            FrameError: bad protocol header (code 0: answer with our header),
                oversized frame, missing end octet or unknown frame type.
        """
        buffer = self._pending + data if self._pending else data
        self._unread = False
        frames: list[FrameRef] = []
        pos = 0
        size_all = len(buffer)
        if self._need_header:
            if size_all < 8:
                if buffer[:size_all] != PROTOCOL_HEADER[:size_all]:
                    raise FrameError(0, "bad protocol header")
                self._pending = buffer
                return buffer, frames
            if buffer[:8] != PROTOCOL_HEADER:
                raise FrameError(0, "bad protocol header")
            frames.append(FrameRef(0, 0, 0, 8))
            pos = 8
            self._need_header = False
        max_size = self.max_frame_size
        unpack = _FRAME_HEADER.unpack_from
        while size_all - pos >= 7:
            kind, channel, size = unpack(buffer, pos)
            if size > max_size:
                raise FrameError(FRAME_ERROR, f"frame size {size} exceeds frame-max {max_size}")
            end = pos + size + 8
            if end > size_all:
                break
            if buffer[end - 1] != FRAME_END:
                raise FrameError(FRAME_ERROR, "frame does not end with 0xCE")
            if kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                raise FrameError(FRAME_ERROR, f"unknown frame type {kind}")
            frames.append(FrameRef(kind, channel, pos, end))
            pos = end
        self._pending = buffer[pos:]
        return buffer, frames


def whole_message(buffer: bytes, frames: Sequence[FrameRef], index: int) -> int:
    """The body size of the message whose content method is ``frames[index]``,
    when its header and its single body frame follow it on the same channel
    and the body is exactly as long as the header says; -1 otherwise (an
    empty body, a body in several frames, a message split across reads, or
    anything malformed, for the frame-by-frame path to judge)."""
    if index + 2 >= len(frames):
        return -1
    method, header, body = frames[index], frames[index + 1], frames[index + 2]
    channel = method.channel
    if (
        header.kind != FRAME_HEADER
        or body.kind != FRAME_BODY
        or header.channel != channel
        or body.channel != channel
        or header.end - header.start < 22  # 7 + class, weight, size, flags + end octet
    ):
        return -1
    (size,) = _U64.unpack_from(buffer, header.start + 11)
    if size == 0 or size != body.end - body.start - 8:
        return -1
    return int(size)


def method_id(buffer: bytes, ref: FrameRef) -> tuple[int, int]:
    """(class_id, method_id) of a method frame.

    Raises:
        FrameError: the payload is too short to hold them.
    """
    if ref.end - ref.start < 12:
        raise FrameError(FRAME_ERROR, "method frame too short")
    ids: tuple[int, int] = _IDS.unpack_from(buffer, ref.start + 7)
    return ids


def decode_method(payload: bytes) -> base.Frame:
    """Decode a method frame payload with pamqp.

    Raises:
        FrameError: unknown method (503) or malformed arguments (502).
    """
    index = int.from_bytes(payload[:4], "big")
    try:
        method: base.Frame = commands.INDEX_MAPPING[index]()
    except KeyError:
        raise FrameError(COMMAND_INVALID, f"unknown method 0x{index:08x}") from None
    try:
        method.unmarshal(payload[4:])
    except Exception as exc:  # pamqp raises struct.error, ValueError, KeyError...
        raise FrameError(SYNTAX_ERROR, f"malformed {method.name}: {exc}") from exc
    return method


def encode_method(channel: int, method: base.Frame) -> bytes:
    """Marshal one method frame the gateway sends on its own behalf."""
    return pamqp_frame.marshal(method, channel)


def _shortstr(payload: bytes, pos: int) -> tuple[str, int]:
    length = payload[pos]
    end = pos + 1 + length
    if end > len(payload):
        raise FrameError(SYNTAX_ERROR, "short string runs past the frame")
    return payload[pos + 1 : end].decode("utf-8", "replace"), end


class PublishMethod(NamedTuple):
    """The parts of ``Basic.Publish`` the gateway needs."""

    exchange: str
    routing_key: str
    mandatory: bool


def decode_publish(payload: bytes) -> PublishMethod:
    """Decode ``Basic.Publish`` (payload starts at the class id).

    Raises:
        FrameError: malformed arguments.
    """
    try:
        exchange, pos = _shortstr(payload, 6)
        routing_key, pos = _shortstr(payload, pos)
        bits = payload[pos]
    except IndexError:
        raise FrameError(SYNTAX_ERROR, "malformed Basic.Publish") from None
    return PublishMethod(exchange, routing_key, bool(bits & 1))


class DeliverMethod(NamedTuple):
    """The parts of ``Basic.Deliver`` the gateway needs."""

    consumer_tag: str
    delivery_tag: int


def decode_deliver(payload: bytes) -> DeliverMethod:
    """Decode ``Basic.Deliver``.

    Raises:
        FrameError: malformed arguments.
    """
    try:
        tag, pos = _shortstr(payload, 4)
        (delivery_tag,) = _U64.unpack_from(payload, pos)
    except (IndexError, struct.error):
        raise FrameError(SYNTAX_ERROR, "malformed Basic.Deliver") from None
    return DeliverMethod(tag, delivery_tag)


class AckMethod(NamedTuple):
    """``Basic.Ack`` / ``Basic.Nack`` / ``Basic.Reject``: tag, multiple, requeue."""

    delivery_tag: int
    multiple: bool
    requeue: bool


def decode_ack(payload: bytes, method: tuple[int, int]) -> AckMethod:
    """Decode Basic.Ack (60.80), Basic.Reject (60.90) or Basic.Nack (60.120).

    Raises:
        FrameError: malformed arguments.
    """
    try:
        (tag,) = _U64.unpack_from(payload, 4)
        bits = payload[12]
    except (IndexError, struct.error):
        raise FrameError(SYNTAX_ERROR, "malformed acknowledgement") from None
    if method == (60, 90):  # reject: requeue is its only bit
        return AckMethod(tag, False, bool(bits & 1))
    if method == (60, 120):
        return AckMethod(tag, bool(bits & 1), bool(bits & 2))
    return AckMethod(tag, bool(bits & 1), False)


@dataclass(frozen=True, slots=True)
class ContentHeaderInfo:
    """Body size and (when present) the headers table of a content header."""

    body_size: int
    headers: dict[str, object] | None


def decode_content_header(payload: bytes, *, want_headers: bool) -> ContentHeaderInfo:
    """Decode a content header payload; the headers table only when asked.

    Raises:
        FrameError: malformed header.
    """
    try:
        _class, _weight, body_size, flags = _CONTENT_HEADER.unpack_from(payload, 0)
    except struct.error:
        raise FrameError(FRAME_ERROR, "content header too short") from None
    headers: dict[str, object] | None = None
    if want_headers and flags & _HEADERS_FLAG:
        content = pamqp_header.ContentHeader()
        try:
            content.unmarshal(payload)
        except Exception as exc:
            raise FrameError(SYNTAX_ERROR, f"malformed content header: {exc}") from exc
        raw = content.properties.headers
        headers = dict(raw) if raw else None
    return ContentHeaderInfo(body_size, headers)


class ContentTracker:
    """Checks method / header / body order per channel for one direction.

    :meth:`method` is called for each method frame, :meth:`header` for each
    content header and :meth:`body` for each body frame; they raise
    :class:`FrameError` on an out-of-order frame and report when a message
    is complete.  :meth:`mid_content` says whether a channel is between a
    content method and its last body frame, where no other frame of that
    channel may be inserted.
    """

    def __init__(self) -> None:
        self._expect_header: set[int] = set()
        self._remaining: dict[int, int] = {}

    def mid_content(self, channel: int) -> bool:
        """True while the channel's current message is incomplete."""
        return channel in self._expect_header or channel in self._remaining

    def method(self, channel: int, ids: tuple[int, int]) -> None:
        """Record a method frame.

        Raises:
            FrameError: 505 when the channel's previous message is incomplete.
        """
        if channel in self._expect_header or channel in self._remaining:
            raise FrameError(
                UNEXPECTED_FRAME, f"method frame on channel {channel} inside a message"
            )
        if ids in CONTENT_METHODS:
            self._expect_header.add(channel)

    def header(self, channel: int, body_size: int) -> bool:
        """Record a content header; True when the message is complete (empty body).

        Raises:
            FrameError: 505 without a preceding content method.
        """
        if channel not in self._expect_header:
            raise FrameError(
                UNEXPECTED_FRAME, f"content header on channel {channel} without a method"
            )
        self._expect_header.discard(channel)
        if body_size:
            self._remaining[channel] = body_size
            return False
        return True

    def body(self, channel: int, size: int) -> bool:
        """Record a body frame of ``size`` bytes; True when the message is complete.

        Raises:
            FrameError: 505 without a header, 501 when it overruns the body size.
        """
        remaining = self._remaining.get(channel)
        if remaining is None:
            raise FrameError(UNEXPECTED_FRAME, f"body frame on channel {channel} without header")
        remaining -= size
        if remaining > 0:
            self._remaining[channel] = remaining
            return False
        del self._remaining[channel]
        if remaining < 0:
            raise FrameError(FRAME_ERROR, f"body on channel {channel} longer than announced")
        return True

    def reset(self, channel: int) -> None:
        """Forget a channel (closed)."""
        self._expect_header.discard(channel)
        self._remaining.pop(channel, None)
