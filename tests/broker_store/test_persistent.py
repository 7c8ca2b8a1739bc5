"""Delivery mode read from a raw content header (store quota accounting)."""

from __future__ import annotations

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from rabbitflow_broker.engine.amqp import persistent


def _payload(properties: commands.Basic.Properties) -> bytes:
    raw = pamqp_frame.marshal(pamqp_header.ContentHeader(0, 10, properties), 1)
    return raw[7:-1]  # frame header and frame end off


def test_delivery_mode_2_is_persistent() -> None:
    assert persistent(_payload(commands.Basic.Properties(delivery_mode=2)))


def test_delivery_mode_1_is_transient() -> None:
    assert not persistent(_payload(commands.Basic.Properties(delivery_mode=1)))


def test_no_delivery_mode_is_transient() -> None:
    assert not persistent(_payload(commands.Basic.Properties(content_type="text/plain")))


def test_delivery_mode_after_type_encoding_and_headers_is_found() -> None:
    properties = commands.Basic.Properties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"a": "b" * 300, "n": 5},
        delivery_mode=2,
    )
    assert persistent(_payload(properties))


def test_truncated_header_is_transient() -> None:
    payload = _payload(
        commands.Basic.Properties(content_type="text/plain", headers={"a": 1}, delivery_mode=2)
    )
    assert not persistent(payload[:20])
