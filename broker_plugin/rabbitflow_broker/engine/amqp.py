"""AMQP 0-9-1 vocabulary for the connection engine (pure, no I/O).

* method ids as named 32-bit constants (``class_id << 16 | method_id``);
* :func:`decode_args`: the arguments of the few methods the gateway reads,
  by a table of field types, in linear time and without pamqp;
* :func:`decode_table`: a linear field-table decoder that never fails on a
  value RabbitMQ accepts: a timestamp outside :mod:`datetime`'s range stays
  an ``int``, bytes that are not UTF-8 stay ``bytes``;
* :class:`LazyHeaders`: a message's headers table decoded only when routing
  actually reads it (headers exchanges, ``CC``/``BCC``);
* the encoders of the frames the gateway sends on its own are in
  :mod:`~rabbitflow_broker.engine.amqp_encode`.

Malformed input raises :class:`~rabbitflow_broker.engine.errors.FrameError` with the
reply code RabbitMQ closes the connection with.  Each constant of the wire
(frame types, reply codes, method ids) is defined here once.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from collections.abc import Iterator, Mapping
from typing import Final

from rabbitflow_broker.engine.errors import FrameError

__all__ = [
    "LazyHeaders",
    "content_properties",
    "decode_args",
    "decode_table",
    "method_name",
    "persistent",
    "reply_text",
    "shortstr",
    "u16",
    "u32",
    "u64",
]


def _m(class_id: int, method_id: int) -> int:
    return class_id << 16 | method_id


CONNECTION_START: Final = _m(10, 10)
CONNECTION_START_OK: Final = _m(10, 11)
CONNECTION_SECURE: Final = _m(10, 20)
CONNECTION_SECURE_OK: Final = _m(10, 21)
CONNECTION_TUNE: Final = _m(10, 30)
CONNECTION_TUNE_OK: Final = _m(10, 31)
CONNECTION_OPEN: Final = _m(10, 40)
CONNECTION_OPEN_OK: Final = _m(10, 41)
CONNECTION_CLOSE: Final = _m(10, 50)
CONNECTION_CLOSE_OK: Final = _m(10, 51)
CONNECTION_BLOCKED: Final = _m(10, 60)
CONNECTION_UNBLOCKED: Final = _m(10, 61)
CHANNEL_OPEN: Final = _m(20, 10)
CHANNEL_OPEN_OK: Final = _m(20, 11)
CHANNEL_FLOW: Final = _m(20, 20)
CHANNEL_FLOW_OK: Final = _m(20, 21)
CHANNEL_CLOSE: Final = _m(20, 40)
CHANNEL_CLOSE_OK: Final = _m(20, 41)
EXCHANGE_DECLARE: Final = _m(40, 10)
EXCHANGE_DECLARE_OK: Final = _m(40, 11)
EXCHANGE_DELETE: Final = _m(40, 20)
EXCHANGE_DELETE_OK: Final = _m(40, 21)
EXCHANGE_BIND: Final = _m(40, 30)
EXCHANGE_BIND_OK: Final = _m(40, 31)
EXCHANGE_UNBIND: Final = _m(40, 40)
EXCHANGE_UNBIND_OK: Final = _m(40, 51)
QUEUE_DECLARE: Final = _m(50, 10)
QUEUE_DECLARE_OK: Final = _m(50, 11)
QUEUE_BIND: Final = _m(50, 20)
QUEUE_BIND_OK: Final = _m(50, 21)
QUEUE_PURGE: Final = _m(50, 30)
QUEUE_PURGE_OK: Final = _m(50, 31)
QUEUE_DELETE: Final = _m(50, 40)
QUEUE_DELETE_OK: Final = _m(50, 41)
QUEUE_UNBIND: Final = _m(50, 50)
QUEUE_UNBIND_OK: Final = _m(50, 51)
BASIC_QOS: Final = _m(60, 10)
BASIC_CONSUME: Final = _m(60, 20)
BASIC_CONSUME_OK: Final = _m(60, 21)
BASIC_CANCEL: Final = _m(60, 30)
BASIC_CANCEL_OK: Final = _m(60, 31)
BASIC_PUBLISH: Final = _m(60, 40)
BASIC_RETURN: Final = _m(60, 50)
BASIC_DELIVER: Final = _m(60, 60)
BASIC_GET: Final = _m(60, 70)
BASIC_GET_OK: Final = _m(60, 71)
BASIC_GET_EMPTY: Final = _m(60, 72)
BASIC_ACK: Final = _m(60, 80)
BASIC_REJECT: Final = _m(60, 90)
BASIC_RECOVER_ASYNC: Final = _m(60, 100)
BASIC_RECOVER: Final = _m(60, 110)
BASIC_NACK: Final = _m(60, 120)
CONFIRM_SELECT: Final = _m(85, 10)
TX_SELECT: Final = _m(90, 10)
TX_COMMIT: Final = _m(90, 20)
TX_COMMIT_OK: Final = _m(90, 21)
TX_ROLLBACK: Final = _m(90, 30)
TX_ROLLBACK_OK: Final = _m(90, 31)

#: Methods followed by a content header and body frames.
CONTENT_METHODS: Final = frozenset({BASIC_PUBLISH, BASIC_RETURN, BASIC_DELIVER, BASIC_GET_OK})

_NAMES: Final = {
    value: name
    for name, value in globals().items()
    if isinstance(value, int) and name.isupper() and "_" in name and value > 0xFFFF
}


def method_name(method: int) -> str:
    """``queue.declare``-style name of a method id (hex when unknown)."""
    name = _NAMES.get(method)
    if name is None:
        return f"method {method >> 16}.{method & 0xFFFF}"
    cls, _, rest = name.partition("_")
    return f"{cls.lower()}.{rest.lower().replace('_', '-')}"


# -- frames ----------------------------------------------------------------------

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE

# -- reply codes ---------------------------------------------------------------

CONNECTION_FORCED: Final = 320
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
CHANNEL_ERROR: Final = 504
UNEXPECTED_FRAME: Final = 505
NOT_ALLOWED: Final = 530
INTERNAL_ERROR: Final = 541

_REPLY_TEXT: Final = {
    200: "OK",
    320: "CONNECTION_FORCED",
    403: "ACCESS_REFUSED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    530: "NOT_ALLOWED",
    541: "INTERNAL_ERROR",
}


def reply_text(code: int, text: str) -> str:
    """RabbitMQ's reply text shape: ``NAME - text``, at most 255 bytes."""
    full = f"{_REPLY_TEXT.get(code, 'INTERNAL_ERROR')} - {text}".encode()
    return full[:255].decode("utf-8", "ignore")


# -- decoding ------------------------------------------------------------------

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


#: The server property a gateway adds to RabbitMQ's Connection.Start: clients
#: (the rabbitflow SDK) tell by it that they are not talking to RabbitMQ itself.
GATEWAY_PROPERTY: Final = "rabbitflow-gateway"


def announce_gateway(frame: bytes, value: str) -> bytes:
    """The Connection.Start method ``frame`` (header to frame-end) with
    :data:`GATEWAY_PROPERTY` = ``value`` added to its server properties; the
    frame unchanged when it is too short to hold them."""
    table_size = _U32.unpack_from(frame, 13)[0] if len(frame) >= 18 else -1
    table_end = 17 + table_size
    if table_size < 0 or table_end > len(frame) - 1:
        return frame
    key = GATEWAY_PROPERTY.encode()
    text_value = value.encode()
    entry = bytes([len(key)]) + key + b"S" + _U32.pack(len(text_value)) + text_value
    payload = b"".join(
        (
            frame[7:13],  # class, method, version
            _U32.pack(table_size + len(entry)),
            frame[17:table_end],
            entry,
            frame[table_end:-1],  # mechanisms, locales
        )
    )
    return frame[:3] + _U32.pack(len(payload)) + payload + b"\xce"


def u16(data: bytes, pos: int) -> int:
    """The big-endian unsigned 16-bit integer at ``data[pos]``.

    The hot path reads fixed fields with these instead of :mod:`struct`:
    compiled, they are plain byte loads with no tuple or boxed integer.

    Raises:
        IndexError: ``data`` ends before it.
    """
    return data[pos] << 8 | data[pos + 1]


def u32(data: bytes, pos: int) -> int:
    """The big-endian unsigned 32-bit integer at ``data[pos]`` (see :func:`u16`)."""
    return data[pos] << 24 | data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3]


def u64(data: bytes, pos: int) -> int:
    """The big-endian unsigned 64-bit integer at ``data[pos]`` (see :func:`u16`)."""
    return u32(data, pos) << 32 | u32(data, pos + 4)


def shortstr(data: bytes, pos: int) -> tuple[str, int]:
    """The short string at ``data[pos]`` and where it ends.

    Raises:
        FrameError: it runs past the end of ``data``.
        IndexError: ``pos`` is past the end.
    """
    end = pos + 1 + data[pos]
    if end > len(data):
        raise FrameError(SYNTAX_ERROR, "short string runs past the frame")
    return data[pos + 1 : end].decode("utf-8", "replace"), end


_SCALARS: Final = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">Q"),
    ord("f"): struct.Struct(">f"),
    ord("d"): struct.Struct(">d"),
}
#: Nesting deeper than this is kept as raw bytes (no recursion without bound).
_MAX_DEPTH = 32
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _bad(what: str) -> FrameError:
    return FrameError(SYNTAX_ERROR, f"malformed {what}")


def _text(raw: bytes | bytearray) -> str | bytes:
    """A string value: ``str`` when it is UTF-8, else the raw bytes."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return bytes(raw)


def decode_table(
    data: bytes | bytearray, pos: int, end: int, depth: int = 0
) -> tuple[dict[str, object], int]:
    """Decode the field table at ``data[pos:]`` (its 4-byte size first) within ``end``.

    Linear in the table's bytes.  Returns (table, position after it).

    Raises:
        FrameError: 502 when the table runs past ``end`` or holds an unknown type.
    """
    if pos + 4 > end:
        raise _bad("field table")
    (size,) = _U32.unpack_from(data, pos)
    pos += 4
    stop = pos + size
    if stop > end:
        raise _bad("field table")
    table: dict[str, object] = {}
    if depth >= _MAX_DEPTH:
        return {"": data[pos:stop]}, stop
    while pos < stop:
        length = data[pos]
        key_end = pos + 1 + length
        if key_end >= stop:
            raise _bad("field table")
        key = _text(data[pos + 1 : key_end])
        value, pos = _value(data, key_end, stop, depth)
        table[key if isinstance(key, str) else key.decode("latin-1")] = value
    return table, stop


def _value(data: bytes | bytearray, pos: int, end: int, depth: int) -> tuple[object, int]:
    kind = data[pos]
    pos += 1
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        stop = pos + scalar.size
        if stop > end:
            raise _bad("field value")
        return scalar.unpack_from(data, pos)[0], stop
    if kind in (0x53, 0x78):  # S longstr, x byte array
        if pos + 4 > end:
            raise _bad("field value")
        (length,) = _U32.unpack_from(data, pos)
        stop = pos + 4 + length
        if stop > end:
            raise _bad("field value")
        raw = data[pos + 4 : stop]
        return (_text(raw) if kind == 0x53 else raw), stop
    if kind == 0x74:  # t boolean
        if pos >= end:
            raise _bad("field value")
        return bool(data[pos]), pos + 1
    if kind == 0x54:  # T timestamp: a datetime when it fits, else the raw seconds
        if pos + 8 > end:
            raise _bad("field value")
        (seconds,) = _U64.unpack_from(data, pos)
        try:
            return _EPOCH + dt.timedelta(seconds=seconds), pos + 8
        except OverflowError:
            return seconds, pos + 8
    if kind == 0x46:  # F table
        return decode_table(data, pos, end, depth + 1)
    if kind == 0x41:  # A array
        return _array(data, pos, end, depth + 1)
    if kind == 0x44:  # D decimal
        if pos + 5 > end:
            raise _bad("field value")
        scale = data[pos]
        (digits,) = struct.unpack_from(">i", data, pos + 1)
        return decimal.Decimal(digits).scaleb(-scale), pos + 5
    if kind == 0x56:  # V void
        return None, pos
    raise _bad(f"field table: unknown field type 0x{kind:02x}")


def _array(data: bytes | bytearray, pos: int, end: int, depth: int) -> tuple[object, int]:
    if pos + 4 > end:
        raise _bad("field array")
    (size,) = _U32.unpack_from(data, pos)
    pos += 4
    stop = pos + size
    if stop > end:
        raise _bad("field array")
    if depth >= _MAX_DEPTH:
        return [data[pos:stop]], stop
    items: list[object] = []
    while pos < stop:
        value, pos = _value(data, pos, stop, depth)
        items.append(value)
    return items, stop


def skip_table(data: bytes, pos: int, end: int) -> int:
    """Position after the field table at ``pos`` (its size only is read).

    Raises:
        FrameError: 502 when the table runs past ``end``.
    """
    if pos + 4 > end:
        raise _bad("field table")
    stop = pos + 4 + u32(data, pos)
    if stop > end:
        raise _bad("field table")
    return stop


#: Argument layouts: s shortstr, S longstr, B octet, H short, L long,
#: Q longlong, b bit (consecutive bits share an octet), F field table.
_LAYOUTS: Final = {
    CONNECTION_START_OK: "FsSs",
    CONNECTION_TUNE: "HLH",
    CONNECTION_TUNE_OK: "HLH",
    CONNECTION_OPEN: "ssb",
    CONNECTION_CLOSE: "HsHH",
    CHANNEL_CLOSE: "HsHH",
    EXCHANGE_DECLARE: "HssbbbbbF",
    EXCHANGE_DELETE: "Hsbb",
    EXCHANGE_BIND: "HsssbF",
    EXCHANGE_UNBIND: "HsssbF",
    QUEUE_DECLARE: "HsbbbbbF",
    QUEUE_DECLARE_OK: "sLL",
    QUEUE_BIND: "HsssbF",
    QUEUE_UNBIND: "HsssF",
    QUEUE_PURGE: "Hsb",
    QUEUE_PURGE_OK: "L",
    QUEUE_DELETE: "Hsbbb",
    BASIC_CONSUME: "HssbbbbF",
    BASIC_CONSUME_OK: "s",
    BASIC_CANCEL: "sb",
    BASIC_CANCEL_OK: "s",
    BASIC_PUBLISH: "Hssbb",
    BASIC_DELIVER: "sQbss",
    BASIC_GET: "Hsb",
    BASIC_GET_OK: "QbssL",
    BASIC_ACK: "Qb",
    BASIC_REJECT: "Qb",
    BASIC_NACK: "Qbb",
}


def decode_args(method: int, payload: bytes, *, tables: bool = True) -> list[object]:
    """The arguments of ``method`` from a method-frame payload (class and
    method ids first), in declaration order; tables as dicts, or ``None``
    when ``tables`` is false (skipped in O(1)).

    Raises:
        FrameError: 502 truncated or malformed arguments.
    """
    layout = _LAYOUTS[method]
    out: list[object] = []
    pos, end = 4, len(payload)
    bit = 8
    try:
        for kind in layout:
            if kind == "b":
                if bit == 8:
                    bits, bit = payload[pos], 0
                    pos += 1
                out.append(bool(bits >> bit & 1))
                bit += 1
                continue
            bit = 8
            if kind == "s":
                stop = pos + 1 + payload[pos]
                if stop > end:
                    raise _bad(method_name(method))
                out.append(_text(payload[pos + 1 : stop]))
                pos = stop
            elif kind == "S":
                stop = pos + 4 + _U32.unpack_from(payload, pos)[0]
                if stop > end:
                    raise _bad(method_name(method))
                out.append(payload[pos + 4 : stop])
                pos = stop
            elif kind == "F":
                if tables:
                    value, pos = decode_table(payload, pos, end)
                    out.append(value)
                else:
                    pos = skip_table(payload, pos, end)
                    out.append(None)
            elif kind == "B":
                out.append(payload[pos])
                pos += 1
            elif kind == "H":
                out.append(_U16.unpack_from(payload, pos)[0])
                pos += 2
            elif kind == "L":
                out.append(_U32.unpack_from(payload, pos)[0])
                pos += 4
            elif kind == "Q":
                out.append(_U64.unpack_from(payload, pos)[0])
                pos += 8
    except (IndexError, struct.error):
        raise _bad(method_name(method)) from None
    return out


def text(value: object) -> str:
    """A decoded short string as ``str`` (non-UTF-8 bytes as latin-1)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


class ContentInfo:
    """What a content header tells the gateway: body size, persistence, headers."""

    __slots__ = ("body_size", "headers", "persistent")

    def __init__(self, body_size: int, persistent: bool, headers: LazyHeaders | None) -> None:
        self.body_size = body_size
        self.persistent = persistent
        self.headers = headers


def content_properties(data: bytes, start: int = 0, end: int = -1) -> ContentInfo:
    """Body size, delivery mode and the (undecoded) headers of the content
    header payload ``data[start:end]`` (all of ``data`` by default).

    Reads only the property flags and the lengths in front of the headers
    table and delivery mode; nothing else is decoded.

    Raises:
        FrameError: 501 when the header is shorter than its fixed part,
            502 when the properties run past the frame.
    """
    if end < 0:
        end = len(data)
    if end - start < 14:
        raise FrameError(FRAME_ERROR, "content header too short")
    body_size = u64(data, start + 4)
    flags = u16(data, start + 12)
    if not flags & 0xF000:
        return ContentInfo(body_size, False, None)
    pos = start + 14
    try:
        if flags & 0x8000:
            pos += 1 + data[pos]
        if flags & 0x4000:
            pos += 1 + data[pos]
        headers = None
        if flags & 0x2000:
            stop = skip_table(data, pos, end)
            if stop - pos > 4:
                headers = LazyHeaders(bytes(data[pos:stop]), 0, stop - pos)
            pos = stop
        persistent = bool(flags & 0x1000) and pos < end and data[pos] == 2
    except IndexError:
        raise _bad("content header") from None
    return ContentInfo(body_size, persistent, headers)


class LazyHeaders(Mapping[str, object]):
    """A message's headers table, decoded on first real use.

    ``"CC" in headers`` / ``"BCC" in headers`` answer from a byte search
    when the key cannot be there, so routing through a direct, topic or
    fanout exchange never decodes the table.
    """

    __slots__ = ("_data", "_decoded", "_end", "_pos")

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self._data = data
        self._pos = pos
        self._end = end
        self._decoded: dict[str, object] | None = None

    def _table(self) -> dict[str, object]:
        if self._decoded is None:
            self._decoded = decode_table(self._data, self._pos, self._end)[0]
        return self._decoded

    def __contains__(self, key: object) -> bool:
        if self._decoded is None and isinstance(key, str) and len(key) < 256:
            raw = key.encode()
            if self._data.find(bytes((len(raw),)) + raw, self._pos + 4, self._end) < 0:
                return False
        return key in self._table()

    def __getitem__(self, key: str) -> object:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __bool__(self) -> bool:
        return self._end - self._pos > 4


def start_ok_user(payload: bytes) -> tuple[str, bool]:
    """(user name, ``connection.blocked`` capability) from a Connection.StartOk.

    The client-properties table is skipped by its size and searched, never
    decoded, so its cost does not grow with its number of entries.

    Raises:
        FrameError: 502 truncated arguments.
    """
    _props, mechanism, response, _locale = decode_args(CONNECTION_START_OK, payload, tables=False)
    blocked = payload.find(b"\x12connection.blockedt\x01", 4, skip_table(payload, 4, len(payload)))
    raw = response if isinstance(response, bytes) else b""
    user = text(mechanism).lower() or "unknown"
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) >= 2:
            user = parts[1].decode("utf-8", "replace")
    elif mechanism == "AMQPLAIN" and b"LOGIN" in raw:
        after = raw.split(b"LOGIN", 1)[1]
        if len(after) >= 5:
            length = int.from_bytes(after[1:5], "big")
            user = after[5 : 5 + length].decode("utf-8", "replace")
    return user, blocked >= 0


def persistent(payload: bytes) -> bool:
    """Whether a content header says delivery mode 2 (a malformed one: no)."""
    try:
        return content_properties(payload).persistent
    except FrameError:
        return False
