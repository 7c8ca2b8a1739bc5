"""The gateway names itself in Connection.Start's server properties."""

from __future__ import annotations

import pika.frame
import pika.spec

from rabbitflow_broker.amqp import GATEWAY_PROPERTY, announce_gateway

RABBITMQ_PROPERTIES = {
    "product": b"RabbitMQ",
    "version": b"3.10.8",
    "capabilities": {"publisher_confirms": True, "connection.blocked": True},
}


def _start_frame() -> bytes:
    start = pika.spec.Connection.Start(
        server_properties=RABBITMQ_PROPERTIES, mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"
    )
    return bytes(pika.frame.Method(0, start).marshal())


def _decode(frame: bytes) -> pika.spec.Connection.Start:
    consumed, decoded = pika.frame.decode_frame(frame)
    assert consumed == len(frame)
    assert isinstance(decoded, pika.frame.Method)
    method = decoded.method
    assert isinstance(method, pika.spec.Connection.Start)
    return method


def test_the_property_is_added_and_everything_else_kept() -> None:
    frame = announce_gateway(_start_frame(), "rabbitflow-broker 1.2.3")

    start = _decode(frame)
    properties = start.server_properties
    assert properties[GATEWAY_PROPERTY] == "rabbitflow-broker 1.2.3"  # pika decodes text
    original = _decode(_start_frame()).server_properties
    assert {k: v for k, v in properties.items() if k != GATEWAY_PROPERTY} == original
    assert len(original) == len(RABBITMQ_PROPERTIES)
    assert (start.mechanisms, start.locales) == (b"PLAIN AMQPLAIN", b"en_US")
    assert (start.version_major, start.version_minor) == (0, 9)
    assert frame[-1] == 0xCE


def test_a_truncated_frame_is_left_as_it_is() -> None:
    frame = _start_frame()
    broken = frame[:13] + (10_000).to_bytes(4, "big") + frame[17:]

    assert announce_gateway(broken, "x") == broken
    assert announce_gateway(frame[:12], "x") == frame[:12]
