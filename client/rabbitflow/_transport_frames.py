"""The publish path's frames, written directly (part of the pika boundary)."""

from __future__ import annotations

import struct
from typing import Any

import pika.data

from ._message import WireProperties

__all__ = ["PublishEncoder"]

# ------------------------------------------------------------ publish frames
# Encoding a publish with pika builds a Method, a Header and BasicProperties
# object per message and walks pika's generic encoders; for the publish path
# the frames are simple enough to write directly: the method frame depends
# only on (channel, exchange, routing key, mandatory) and is cached, the
# content header is packed field by field, and the header table of
# application properties (usually the same few keys) is cached by value.
_FRAME_END = b"\xce"
_HEADER_PREFIX = struct.Struct(">BHIHHQH")  # type, channel, size, class, weight, body size, flags
_BODY_PREFIX = struct.Struct(">BHI")
_TABLE_SIZE = struct.Struct(">I")
_INT32 = struct.Struct(">ci")  # pika's table value for an int that fits 32 bits
_INT64 = struct.Struct(">cq")  # ... and for a larger one
_UINT64 = struct.Struct(">Q")
_LENGTHS = tuple(bytes((n,)) for n in range(256))  # a short string's length byte


class PublishEncoder:
    """Encodes Basic.Publish + content header + body frames to bytes."""

    def __init__(self) -> None:
        self._methods: dict[tuple[int, str, str, bool], bytes] = {}
        self._tables: dict[tuple[tuple[str, Any], ...], bytes] = {}
        self._keys: dict[str, bytes] = {}  # header name -> short string
        # content type / encoding and message type -> short string: the same
        # few values in every publish
        self._shorts: dict[str, bytes] = {}

    @staticmethod
    def _short(text: str) -> bytes:
        data = text.encode()
        size = len(data)
        if size > 255:
            raise ValueError(f"AMQP short string too long ({size} bytes)")
        return _LENGTHS[size] + data

    def _known_short(self, text: str) -> bytes:
        short = self._shorts.get(text)
        if short is None:
            short = self._short(text)
            if len(self._shorts) > 1000:
                self._shorts.clear()
            self._shorts[text] = short
        return short

    def _method(self, channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        key = (channel, exchange, routing_key, mandatory)
        frame = self._methods.get(key)
        if frame is None:
            payload = (
                struct.pack(">HHH", 60, 40, 0)
                + self._short(exchange)
                + self._short(routing_key)
                + (b"\x01" if mandatory else b"\x00")
            )
            frame = struct.pack(">BHI", 1, channel, len(payload)) + payload + _FRAME_END
            if len(self._methods) > 1000:
                self._methods.clear()
            self._methods[key] = frame
        return frame

    def _table(self, headers: dict[str, Any]) -> bytes:
        if len(headers) == 1:
            # The common case, ``{"JMSTimestamp": ms}``: its value differs in
            # every message, so the cache below would only miss; pack it here
            # exactly as pika's encode_table does.
            ((name, value),) = headers.items()
            if type(value) is int:
                short = self._keys.get(name)
                if short is None:
                    short = self._short(name)
                    if len(self._keys) > 1000:
                        self._keys.clear()
                    self._keys[name] = short
                if -0x80000000 <= value <= 0x7FFFFFFF:
                    return _TABLE_SIZE.pack(len(short) + 5) + short + _INT32.pack(b"I", value)
                return _TABLE_SIZE.pack(len(short) + 9) + short + _INT64.pack(b"l", value)
        try:
            key = tuple(sorted(headers.items()))
            hash(key)
        except TypeError:  # unhashable values: encode without the cache
            pieces: list[bytes] = []
            pika.data.encode_table(pieces, headers)
            return b"".join(pieces)
        table = self._tables.get(key)
        if table is None:
            pieces = []
            pika.data.encode_table(pieces, headers)
            table = b"".join(pieces)
            if len(self._tables) > 1000:
                self._tables.clear()
            self._tables[key] = table
        return table

    def _properties(self, props: WireProperties) -> tuple[int, bytes]:
        flags = 0
        out: list[bytes] = []
        short = self._short
        if props.content_type is not None:
            flags |= 1 << 15
            out.append(self._known_short(props.content_type))
        if props.content_encoding is not None:
            flags |= 1 << 14
            out.append(self._known_short(props.content_encoding))
        if props.headers is not None:
            flags |= 1 << 13
            out.append(self._table(props.headers))
        if props.delivery_mode is not None:
            flags |= 1 << 12
            out.append(bytes((props.delivery_mode,)))
        if props.priority is not None:
            flags |= 1 << 11
            out.append(bytes((props.priority,)))
        if props.correlation_id is not None:
            flags |= 1 << 10
            out.append(short(props.correlation_id))
        if props.reply_to is not None:
            flags |= 1 << 9
            out.append(short(props.reply_to))
        if props.expiration is not None:
            flags |= 1 << 8
            out.append(short(props.expiration))
        if props.message_id is not None:
            flags |= 1 << 7
            out.append(short(props.message_id))
        if props.timestamp is not None:
            flags |= 1 << 6
            out.append(_UINT64.pack(props.timestamp))
        if props.type is not None:
            flags |= 1 << 5
            out.append(self._known_short(props.type))
        return flags, b"".join(out)

    def encode(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        props: WireProperties,
        *,
        mandatory: bool,
        body_max: int,
    ) -> bytes:
        """The frames of one publish, joined.

        Raises:
            ValueError: a value that does not fit its AMQP field.
        """
        flags, fields = self._properties(props)
        size = len(body)
        parts = [
            self._method(channel, exchange, routing_key, mandatory),
            _HEADER_PREFIX.pack(2, channel, 14 + len(fields), 60, 0, size, flags),
            fields,
            _FRAME_END,
        ]
        for start in range(0, size, body_max):
            chunk = body[start : start + body_max]
            parts += [_BODY_PREFIX.pack(3, channel, len(chunk)), chunk, _FRAME_END]
        return b"".join(parts)
