"""Streams through the gateway: governed by retention, never by flow control."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from integration.broker.conftest import RunningGateway

STREAM = {"x-queue-type": "stream"}


def _declare_stream(gateway: RunningGateway, name: str) -> None:
    connection = gateway.connect()
    connection.channel().queue_declare(name, durable=True, arguments=STREAM)
    connection.close()


def test_stream_past_the_default_queue_limit_gets_no_flow_and_every_confirm(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(default_queue_limit=1000)
    name = unique_name("stream")
    cleanup_queues.append(name)
    _declare_stream(gateway, name)
    info = gateway.queue(name)
    assert (info["source"], info["flowStopCount"], info["flowStopSize"]) == ("none", 0, 0)

    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()  # pika raises on a nack
    flows: list[bool] = []
    channel._impl.add_on_flow_callback(lambda frame: flows.append(frame.method.active))
    for n in range(100):
        channel.basic_publish("", name, b"%03d" % n + b"." * 97)  # 10,000 bytes in all
    connection.close()

    assert flows == []
    assert gateway.queue(name)["flowStopped"] is False
    assert gateway.events("QUE-1003", name) == []
    assert gateway.events("CHN-1005") == []


def test_stream_declare_with_a_flow_threshold_is_refused_naming_it(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("stream-flow")
    cleanup_queues.append(name)
    connection = gateway.connect()
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare(name, durable=True, arguments={**STREAM, "qpid.flow_stop_count": 100})
    assert refused.value.reply_code == 406
    assert "qpid.flow_stop_count" in refused.value.reply_text
    # The connection's other channels carry on; the stream was never created.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
        connection.channel().queue_declare(name, passive=True)
    assert missing.value.reply_code == 404
    connection.close()


def test_stream_consumer_from_the_first_offset_reads_everything_through_the_gateway(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("stream-read")
    cleanup_queues.append(name)
    _declare_stream(gateway, name)
    connection = gateway.connect()
    publisher = connection.channel()
    publisher.confirm_delivery()
    sent = [b"m%d" % n for n in range(50)]
    for body in sent:
        publisher.basic_publish("", name, body)

    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=10)  # streams require a prefetch and manual acks
    got: list[bytes] = []
    for method, _props, body in consumer.consume(
        name, arguments={"x-stream-offset": "first"}, inactivity_timeout=10
    ):
        assert method is not None, f"only {len(got)} of {len(sent)} messages arrived"
        got.append(body)
        consumer.basic_ack(method.delivery_tag)
        if len(got) == len(sent):
            break
    consumer.cancel()
    connection.close()
    assert got == sent


def test_runtime_thresholds_on_a_stream_are_refused_by_the_admin_api(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("stream-put")
    cleanup_queues.append(name)
    _declare_stream(gateway, name)
    status, body = gateway.http(
        "PUT", f"/api/queues/%2F/{quote(name)}/flow", {"flowStopCount": 100}
    )
    assert status == 400
    assert "flowStopCount" in body["error"]
    assert "stream" in body["error"]
    assert gateway.queue(name)["source"] == "none"
