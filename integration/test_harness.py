"""The harness itself: brokers answer, throwaway nodes are private."""

from __future__ import annotations

import pika

from rabbitflow_broker.server.rabbitmq_node import amqp_handshake_ok, free_port

from .conftest import Broker


def test_shared_broker_answers_an_amqp_handshake(broker: Broker) -> None:
    assert amqp_handshake_ok(broker.host, broker.port)


def test_a_closed_port_is_not_a_broker() -> None:
    assert not amqp_handshake_ok("127.0.0.1", free_port(), timeout=0.5)


def test_throwaway_node_is_private_and_restartable(throwaway_broker: Broker) -> None:
    node = throwaway_broker.node
    assert node is not None
    assert node.amqp_port not in (5672, 25672)
    assert node.dist_port != 25672
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.queue_declare("harness-durable", durable=True)
    channel.basic_publish("", "harness-durable", b"kept", pika.BasicProperties(delivery_mode=2))
    connection.close()
    node.restart()
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    _, _, body = channel.basic_get("harness-durable", auto_ack=True)
    connection.close()
    assert body == b"kept"
