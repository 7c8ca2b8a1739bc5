"""The gateway names itself in Connection.Start, and the node in a Connection.Close 320."""

from __future__ import annotations

import pika.frame
import pika.spec

from rabbitflow_broker.engine.amqp import GATEWAY_PROPERTY, announce_gateway
from rabbitflow_broker.engine.amqp_encode import name_node

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


def _close_frame(code: int, text: str, class_id: int = 60, method_id: int = 40) -> bytes:
    close = pika.spec.Connection.Close(
        reply_code=code, reply_text=text, class_id=class_id, method_id=method_id
    )
    return bytes(pika.frame.Method(0, close).marshal())


def _decode_close(frame: bytes) -> pika.spec.Connection.Close:
    consumed, decoded = pika.frame.decode_frame(frame)
    assert consumed == len(frame)
    assert isinstance(decoded, pika.frame.Method)
    method = decoded.method
    assert isinstance(method, pika.spec.Connection.Close)
    return method


def test_a_320_close_names_the_node_and_keeps_code_and_ids() -> None:
    close = _decode_close(name_node(_close_frame(320, "CONNECTION_FORCED - shutdown"), "h:5672"))
    assert close.reply_code == 320
    assert close.reply_text == "upstream node h:5672 went away: CONNECTION_FORCED - shutdown"
    assert (close.class_id, close.method_id) == (60, 40)


def test_other_closes_and_short_frames_are_left_as_they_are() -> None:
    for frame in (_close_frame(530, "NOT_ALLOWED - x"), _close_frame(200, "OK")):
        assert name_node(frame, "h:5672") == frame
    frame = _close_frame(320, "CONNECTION_FORCED - x")
    assert name_node(frame[:15], "h:5672") == frame[:15]
    broken = frame[:13] + bytes([200]) + frame[14:]  # the text runs past the frame
    assert name_node(broken, "h:5672") == broken
