"""Unusual but valid message properties: what RabbitMQ accepts, the gateway accepts too.

Each case publishes one message whose content header carries something a
Python decoder may choke on (timestamps in µs or ns beside headers, header
values of type timestamp beyond year 9999, also inside arrays, short
strings that are not UTF-8, every field-table type), built byte by byte
with the raw client, to the default exchange and to a headers exchange.
The same is done directly and through the gateway, each path declaring its
own queues, exchange and bindings (a binding that matches on the unusual
value itself, so routing on it is compared too).  Directly, RabbitMQ must
accept the message (the case is valid); through the gateway the publish is
confirmed the same way, it reaches the same queues, and the properties and
body come back byte for byte as they do directly.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from integration.broker._raw_amqp import (
    Delivered,
    RawConnection,
    basic_get,
    longstr,
    method,
    publish_confirmed,
    select_confirms,
    shortstr,
    u8,
    u16,
    u32,
    u64,
)
from integration.broker.conftest import RunningGateway
from integration.conftest import Broker

# Property flag bits of the Basic class, in wire order.
_FLAGS = {
    "content_type": 0x8000,
    "content_encoding": 0x4000,
    "headers": 0x2000,
    "delivery_mode": 0x1000,
    "priority": 0x0800,
    "correlation_id": 0x0400,
    "reply_to": 0x0200,
    "expiration": 0x0100,
    "message_id": 0x0080,
    "timestamp": 0x0040,
    "type": 0x0020,
    "user_id": 0x0010,
    "app_id": 0x0008,
    "cluster_id": 0x0004,
}

#: Seconds since the epoch of 2023-11-14, then the same instant in µs and ns.
_SECONDS = 1_700_000_000
_MICROS = _SECONDS * 1_000_000
_NANOS = _SECONDS * 1_000_000_000


def _properties(**values: bytes) -> bytes:
    """The flags word and the encoded values, in wire order."""
    flags = 0
    data = b""
    for name, bit in _FLAGS.items():
        if name in values:
            flags |= bit
            data += values[name]
    unknown = set(values) - set(_FLAGS)
    assert not unknown, unknown
    return u16(flags) + data


def _field_table(entries: list[tuple[bytes, bytes]]) -> bytes:
    return longstr(b"".join(shortstr(name) + value for name, value in entries))


def _array(values: list[bytes]) -> bytes:
    return b"A" + longstr(b"".join(values))


_TIMESTAMP_FAR = b"T" + u64(_MICROS)  # year ~53,800
_EVERY_TYPE: list[tuple[bytes, bytes]] = [
    (b"bool", b"t" + u8(1)),
    (b"int8", b"b" + struct.pack(">b", -128)),
    (b"uint8", b"B" + u8(255)),
    (b"int16", b"s" + struct.pack(">h", -32768)),
    (b"uint16", b"u" + u16(65535)),
    (b"int32", b"I" + struct.pack(">i", -(2**31))),
    (b"uint32", b"i" + u32(2**32 - 1)),
    (b"int64", b"l" + struct.pack(">q", -(2**63))),
    (b"float", b"f" + struct.pack(">f", 1.5)),
    (b"double", b"d" + struct.pack(">d", -2.25)),
    (b"decimal", b"D" + u8(2) + u32(12345)),
    (b"longstr", b"S" + longstr(b"plain text")),
    (b"bytes", b"x" + longstr(bytes(range(256)))),
    (b"array", _array([b"I" + u32(7), b"S" + longstr(b"x"), b"V"])),
    (b"timestamp", b"T" + u64(_SECONDS)),
    (b"table", b"F" + _field_table([(b"inner", b"l" + u64(2**63 - 1))])),
    (b"void", b"V"),
]


@dataclass(frozen=True)
class Case:
    """One message: its properties (beside the routing header) and what to bind on."""

    #: Properties other than ``headers``.
    properties: dict[str, bytes] = field(default_factory=dict)
    #: Header entries besides ``route``.
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: A header entry a second binding matches on (x-match all), when the case has one.
    odd: tuple[bytes, bytes] | None = None


_CASES: dict[str, Case] = {
    "timestamp in microseconds beside headers": Case(
        properties={"timestamp": u64(_MICROS), "delivery_mode": u8(2), "priority": u8(5)}
    ),
    "timestamp in nanoseconds beside headers": Case(properties={"timestamp": u64(_NANOS)}),
    "timestamp header beyond year 9999": Case(odd=(b"when", _TIMESTAMP_FAR)),
    "timestamps beyond year 9999 in an array": Case(
        odd=(b"times", _array([_TIMESTAMP_FAR, b"T" + u64(2**64 - 1)]))
    ),
    "timestamp beyond year 9999 in a nested table": Case(
        odd=(b"nested", b"F" + _field_table([(b"when", _TIMESTAMP_FAR)]))
    ),
    "non-utf8 message-id beside headers": Case(
        properties={"message_id": shortstr(b"\xff\xfe\x80id"), "timestamp": u64(_NANOS)}
    ),
    "non-utf8 in every short-string property": Case(
        properties={
            "content_type": shortstr(b"text/\xff"),
            "content_encoding": shortstr(b"\xc3\x28"),
            "correlation_id": shortstr(b"\x80\x81"),
            "reply_to": shortstr(b"reply-\xfe"),
            "message_id": shortstr(b"\xed\xa0\x80"),
            "type": shortstr(b"\xf8\x88\x80\x80\x80"),
            "user_id": shortstr(b"guest"),
            "app_id": shortstr(b"app\xff"),
            "cluster_id": shortstr(b"\xc0\xaf"),
        }
    ),
    "non-utf8 header name and value": Case(odd=(b"k\xff\xfe", b"S" + longstr(b"\xc3\x28\xa0"))),
    "every field-table type": Case(headers=_EVERY_TYPE, odd=(b"dec", b"D" + u8(2) + u32(12345))),
    "every field-table type inside an array": Case(
        odd=(b"all", _array([value for _name, value in _EVERY_TYPE]))
    ),
}

_BODY = b"rabbitflow \x00\xff unusual properties"
_ROUTE = (b"route", b"S" + longstr(b"yes"))


@dataclass(frozen=True)
class Outcome:
    """What one path did with the message: the publish answer and each queue's delivery."""

    accepted: tuple[str, int, int, int]
    delivered: dict[str, Delivered | None]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def _expect(connection: RawConnection, wanted: tuple[int, int]) -> None:
    connection.expect_method(wanted, time.monotonic() + 10)


def _declare_queue(connection: RawConnection, name: bytes) -> None:
    connection.send(method(1, 50, 10, u16(0) + shortstr(name) + u8(0) + _field_table([])))
    _expect(connection, (50, 11))


def _bind(connection: RawConnection, queue: bytes, exchange: bytes, args: bytes) -> None:
    connection.send(
        method(
            1, 50, 20, u16(0) + shortstr(queue) + shortstr(exchange) + shortstr(b"") + u8(0) + args
        )
    )
    _expect(connection, (50, 21))


def _run_path(host: str, port: int, names: dict[str, bytes], case: Case, target: str) -> Outcome:
    """Declare, bind, publish and get the message back on one path (direct or gateway)."""
    headers = [_ROUTE, *case.headers] + ([case.odd] if case.odd else [])
    properties = _properties(headers=_field_table(headers), **case.properties)
    with RawConnection(host, port) as connection:
        connection.login()
        connection.open_channel(1)
        for role in ("plain", "all", "odd"):
            _declare_queue(connection, names[role])
        exchange = names["exchange"]
        connection.send(
            method(
                1,
                40,
                10,
                u16(0) + shortstr(exchange) + shortstr(b"headers") + u8(0) + _field_table([]),
            )
        )
        _expect(connection, (40, 11))
        _bind(
            connection,
            names["all"],
            exchange,
            _field_table([(b"x-match", b"S" + longstr(b"all")), _ROUTE]),
        )
        if case.odd is not None:
            _bind(
                connection,
                names["odd"],
                exchange,
                _field_table([(b"x-match", b"S" + longstr(b"all")), case.odd]),
            )
        connection.open_channel(2)
        select_confirms(connection, 2)
        if target == "default exchange":
            answer = publish_confirmed(
                connection, 2, b"", names["plain"], properties=properties, body=_BODY
            )
        else:
            answer = publish_confirmed(
                connection, 2, exchange, b"", properties=properties, body=_BODY
            )
        delivered = (
            {role: basic_get(connection, 1, names[role]) for role in ("plain", "all", "odd")}
            if answer.kind == "ok"
            else {}
        )
    return Outcome(answer.key(), delivered)


@pytest.fixture
def declared(
    broker: Broker, unique_name: Callable[[str], str]
) -> Iterator[Callable[[], dict[str, bytes]]]:
    """Fresh queue and exchange names per path; deleted (directly) after the test."""
    made: list[dict[str, bytes]] = []

    def make() -> dict[str, bytes]:
        names = {role: unique_name(role).encode() for role in ("plain", "all", "odd", "exchange")}
        made.append(names)
        return names

    yield make
    connection = broker.blocking_connection()
    try:
        for names in made:
            channel = connection.channel()
            for role in ("plain", "all", "odd"):
                with contextlib.suppress(Exception):
                    channel.queue_delete(names[role].decode())
            with contextlib.suppress(Exception):
                channel.exchange_delete(names["exchange"].decode())
            with contextlib.suppress(Exception):
                channel.close()
    finally:
        connection.close()


@pytest.mark.parametrize("target", ["default exchange", "headers exchange"])
@pytest.mark.parametrize("name", list(_CASES))
def test_gateway_delivers_what_rabbitmq_accepts_byte_identical(
    broker: Broker,
    gateway: RunningGateway,
    declared: Callable[[], dict[str, bytes]],
    name: str,
    target: str,
) -> None:
    case = _CASES[name]
    direct = _run_path(*_host_port(broker.url), declared(), case, target)
    assert direct.accepted == ("ok", 0, 0, 0), f"RabbitMQ refused the case: {direct.accepted}"
    assert any(direct.delivered.values()), "RabbitMQ routed the message nowhere"

    through = _run_path("127.0.0.1", gateway.port, declared(), case, target)

    assert through == direct
