"""The gateway is a transparent AMQP relay for clients that do not hit flow control."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from integration.broker.conftest import RunningGateway, wait_for


def test_publish_and_consume_round_trip_through_gateway(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("relay")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    bodies = [f"m{i}".encode() * (i + 1) for i in range(50)]
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(headers={"i": 1}))
    received = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=5):
        assert method is not None, "delivery missing"
        received.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(received) == len(bodies):
            break
    channel.cancel()
    connection.close()
    assert received == bodies


def test_large_message_spanning_many_frames_arrives_intact(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("big")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    body = bytes(range(256)) * 4096  # 1 MiB: many body frames
    channel.basic_publish("", queue, body)
    method, _props, got = channel.basic_get(queue, auto_ack=True)
    connection.close()
    assert method is not None
    assert got == body


def test_depth_follows_publishes_and_acks(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("depth")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    for _ in range(3):
        channel.basic_publish("", queue, b"12345")
    assert gateway.queue(queue)["messages"] == 3
    assert gateway.queue(queue)["bytes"] == 15
    method, _props, _body = channel.basic_get(queue)
    assert method is not None
    assert gateway.queue(queue)["messages"] == 3  # unacked still counts
    channel.basic_ack(method.delivery_tag)
    wait_for(lambda: gateway.queue(queue)["messages"] == 2, what="depth 2 after ack")
    connection.close()


def test_topic_exchange_routing_is_mirrored(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    exchange, queue = unique_name("ex"), unique_name("bound")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "a.*")
    channel.basic_publish(exchange, "a.b", b"x")
    channel.basic_publish(exchange, "z.b", b"y")
    assert gateway.queue(queue)["messages"] == 1
    channel.exchange_delete(exchange)
    connection.close()


def test_bad_frame_closes_only_that_connection(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("other")
    cleanup_queues.append(queue)
    healthy = gateway.connect()
    channel = healthy.channel()
    channel.queue_declare(queue)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        sock.recv(4096)  # Connection.Start
        # A method frame whose end octet is wrong.
        sock.sendall(struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0b" + b"\x00")
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    # Connection.Close (10, 50) with reply code 501 FRAME_ERROR.
    assert data[:1] == b"\x01"
    assert struct.unpack(">HHH", data[7:13]) == (10, 50, 501)
    channel.basic_publish("", queue, b"still fine")
    _method, _props, body = channel.basic_get(queue, auto_ack=True)
    healthy.close()
    assert body == b"still fine"


def test_wrong_protocol_header_gets_ours_back(gateway: RunningGateway) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"AMQP\x01\x01\x00\x0a")
        assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"


def test_bad_credentials_are_refused_by_rabbitmq(gateway: RunningGateway) -> None:
    params = pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{gateway.port}/%2F")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)


def test_nacked_publish_is_not_counted(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("reject")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(
        queue,
        arguments={
            "x-max-length": 2,
            "x-overflow": "reject-publish",
            "qpid.flow_stop_count": 0,
            "qpid.flow_stop_size": 0,
        },
    )
    channel.basic_publish("", queue, b"1")
    channel.basic_publish("", queue, b"2")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", queue, b"3")
    connection.close()
    assert gateway.queue(queue)["messages"] == 2


def test_purge_and_delete_through_gateway_update_depth(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("purge")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    for _ in range(4):
        channel.basic_publish("", queue, b"abcd")
    channel.queue_purge(queue)
    assert (gateway.queue(queue)["messages"], gateway.queue(queue)["bytes"]) == (0, 0)
    channel.queue_delete(queue)
    status, _ = gateway.http("GET", f"/api/queues/%2F/{queue}")
    connection.close()
    assert status == 404


def test_unacked_deliveries_stay_in_depth_when_consumer_channel_closes(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("requeue")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"x")
    consumer = connection.channel()
    method, _props, _body = consumer.basic_get(queue)
    assert method is not None
    consumer.close()
    assert gateway.queue(queue)["messages"] == 1
    method, _props, _body = channel.basic_get(queue)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    wait_for(lambda: gateway.queue(queue)["messages"] == 0, what="depth 0 after reject")
    connection.close()
