"""Encoders of the few AMQP 0-9-1 frames the gateway sends on its own (pure)."""

from __future__ import annotations

import struct
from typing import Final

from rabbitflow_broker.amqp import (
    BASIC_ACK,
    BASIC_NACK,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_FLOW,
    CONNECTION_BLOCKED,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
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
