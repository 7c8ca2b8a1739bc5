"""The gateway to an ``amqps://`` upstream: a throwaway RabbitMQ node with a TLS listener.

The node's certificate is signed by a CA made in the test; the gateway
verifies it against ``--upstream-ca``.  The shared node is never touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from integration.broker.conftest import RunningGateway
from integration.broker_ops._tls import CertificateAuthority, make_ca
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import RabbitMQNode, free_port

pytestmark = pytest.mark.slow


class TlsNode:
    """A throwaway RabbitMQ node with an AMQPS listener signed by ``ca``."""

    def __init__(self, ca: CertificateAuthority) -> None:
        self.ca = ca
        self.tls_port = free_port()
        server = ca.issue("rabbitmq")
        self.node = RabbitMQNode(
            management=True,
            extra_config=[
                f"listeners.ssl.default = {self.tls_port}",
                f"ssl_options.cacertfile = {ca.cert}",
                f"ssl_options.certfile = {server.cert}",
                f"ssl_options.keyfile = {server.key}",
                "ssl_options.verify = verify_none",
                "ssl_options.fail_if_no_peer_cert = false",
            ],
        )

    def amqps_url(self, host: str = "localhost") -> str:
        return f"amqps://guest:guest@{host}:{self.tls_port}/%2F"


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    ca = make_ca(tmp_path_factory.mktemp("upstream-pki"))
    node = TlsNode(ca)
    node.node.start()
    try:
        yield node
    finally:
        node.node.close()


def test_gateway_relays_to_an_amqps_upstream_verified_with_upstream_ca(
    broker_factory_gateway: Callable[..., RunningGateway], tls_node: TlsNode
) -> None:
    gateway = broker_factory_gateway(tls_node.amqps_url(), upstream_ca=str(tls_node.ca.cert))
    queue = f"rf-upstream-tls-{uuid.uuid4().hex[:8]}"

    connection = gateway.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for number in range(200):
            channel.basic_publish("", queue, str(number).encode())
        bodies = []
        for _ in range(200):
            _method, _properties, body = channel.basic_get(queue, auto_ack=True)
            bodies.append(body)
        channel.queue_delete(queue)
    finally:
        connection.close()

    assert bodies == [str(n).encode() for n in range(200)]


def test_upstream_with_a_certificate_from_another_ca_is_refused(
    broker_factory_gateway: Callable[..., RunningGateway],
    tls_node: TlsNode,
    tmp_path: Path,
) -> None:
    stranger = make_ca(tmp_path / "stranger", name="stranger")
    gateway = broker_factory_gateway(tls_node.amqps_url(), upstream_ca=str(stranger.cert))

    # pika wraps a Connection.Close before Connection.Start, text and all.
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        gateway.connect()

    text = str(refused.value)
    assert "(320)" in text, text
    assert "certificate verify failed" in text, text


@pytest.fixture
def broker_factory_gateway(
    tls_node: TlsNode, tmp_path: Path
) -> Iterator[Callable[..., RunningGateway]]:
    """In-process gateways whose upstream is ``tls_node`` (URL given per test)."""
    started: list[RunningGateway] = []

    def make(upstream: str, **options: object) -> RunningGateway:
        target = Broker(upstream, tls_node.node.management_url)
        running = RunningGateway(target, tmp_path / f"events-{len(started)}.jsonl", **options)
        started.append(running.start())
        return running

    yield make
    for running in started:
        running.close_clients()
        running.stop()
