"""Encoders of the few AMQP 0-9-1 frames the gateway sends on its own, and of
the one RabbitMQ frame it rewrites beyond Connection.Start (pure)."""

from __future__ import annotations

import struct
from typing import Final

from rabbitflow_broker.engine.amqp import (
    BASIC_ACK,
    BASIC_NACK,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_FLOW,
    CONNECTION_BLOCKED,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_FORCED,
    CONNECTION_UNBLOCKED,
    TX_COMMIT_OK,
)

__all__ = [
    "CHANNEL_CLOSE_OK_FRAME",
    "CONNECTION_CLOSE_OK_FRAME",
    "CONNECTION_UNBLOCKED_FRAME",
    "channel_close_ok",
    "close_frame",
    "commit_ok",
    "confirm_frame",
    "connection_blocked",
    "encode_method",
    "flow_frame",
    "name_node",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

_FRAME = struct.Struct(">BHI")


def encode_method(channel: int, method: int, args: bytes = b"") -> bytes:
    """One method frame: ``args`` are the marshalled arguments."""
    payload = _U32.pack(method) + args
    return _FRAME.pack(1, channel, len(payload)) + payload + b"\xce"


def _encode_shortstr(value: str) -> bytes:
    raw = value.encode()[:255]
    return bytes((len(raw),)) + raw


def close_frame(channel: int, code: int, text_: str, failing: int = 0) -> bytes:
    """Connection.Close (channel 0) or Channel.Close with a reply code and text."""
    method = CONNECTION_CLOSE if channel == 0 else CHANNEL_CLOSE
    args = _U16.pack(code) + _encode_shortstr(text_) + _U32.pack(failing)
    return encode_method(channel, method, args)


def flow_frame(channel: int, active: bool) -> bytes:
    """Channel.Flow."""
    return encode_method(channel, CHANNEL_FLOW, b"\x01" if active else b"\x00")


def confirm_frame(channel: int, tag: int, multiple: bool, ack: bool) -> bytes:
    """Basic.Ack or Basic.Nack (requeue false)."""
    if ack:
        return encode_method(
            channel, BASIC_ACK, _U64.pack(tag) + (b"\x01" if multiple else b"\x00")
        )
    return encode_method(channel, BASIC_NACK, _U64.pack(tag) + (b"\x01" if multiple else b"\x00"))


CHANNEL_CLOSE_OK_FRAME: Final = encode_method(0, CHANNEL_CLOSE_OK)


def channel_close_ok(channel: int) -> bytes:
    """Channel.CloseOk."""
    return encode_method(channel, CHANNEL_CLOSE_OK)


def commit_ok(channel: int) -> bytes:
    """Tx.CommitOk."""
    return encode_method(channel, TX_COMMIT_OK)


CONNECTION_CLOSE_OK_FRAME: Final = encode_method(0, CONNECTION_CLOSE_OK)
CONNECTION_UNBLOCKED_FRAME: Final = encode_method(0, CONNECTION_UNBLOCKED)


def connection_blocked(reason: str) -> bytes:
    """Connection.Blocked."""
    return encode_method(0, CONNECTION_BLOCKED, _encode_shortstr(reason))


def name_node(frame: bytes, node: str) -> bytes:
    """The Connection.Close method ``frame`` (header to frame-end) with its
    text naming the RabbitMQ node it came from when its reply code is 320
    (RabbitMQ's own when a node stops): ``upstream node NODE went away:``
    then RabbitMQ's text, at most 255 bytes.  The reply code, the failing
    class and method ids are kept; any other frame is returned unchanged."""
    if len(frame) < 20 or frame[11] << 8 | frame[12] != CONNECTION_FORCED:
        return frame
    text_end = 14 + frame[13]
    if text_end + 5 != len(frame):  # class id, method id, frame-end
        return frame
    prefix = f"upstream node {node} went away: ".encode()
    named = (prefix + frame[14:text_end])[:255].decode("utf-8", "ignore").encode()
    payload = frame[7:13] + bytes([len(named)]) + named + frame[text_end:-1]
    return frame[:3] + _U32.pack(len(payload)) + payload + b"\xce"
