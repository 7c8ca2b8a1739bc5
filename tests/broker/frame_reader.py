"""A frame splitter for tests: reads what the engine wrote back into frames.

The gateway itself never splits a stream like this (the engine scans its
buffers in place); the tests use it to read the bytes it forwarded.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from pamqp import base, commands

from rabbitflow_broker.engine.amqp import (
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
)
from rabbitflow_broker.engine.errors import FrameError

__all__ = ["FrameReader", "FrameRef", "decode_method"]

_FRAME_HEADER = struct.Struct(">BHI")
_DEFAULT_MAX_FRAME = 1 << 20


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
