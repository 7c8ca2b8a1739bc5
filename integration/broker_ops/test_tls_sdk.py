"""The rabbitflow SDK over amqps:// to the gateway's --listen-tls (throwaway CA).

An SDK producer sends through the gateway over TLS while a raw pika
consumer reads over TLS too: every message arrives exactly once, in order.
A client that does not trust the CA fails with the SDK's TLSError.
"""

from __future__ import annotations

import ssl
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

import rabbitflow
from integration.broker.conftest import RunningGateway, wait_for
from integration.broker_ops._tls import CertificateAuthority, Issued, make_ca

MESSAGES = 2_000


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return make_ca(tmp_path / "pki")


@pytest.fixture
def tls_gateway(
    gateway_factory: Callable[..., RunningGateway], ca: CertificateAuthority
) -> RunningGateway:
    server: Issued = ca.issue("server")
    return gateway_factory(
        listen_tls="127.0.0.1:0", tls_cert=str(server.cert), tls_key=str(server.key)
    )


def _amqps(gateway: RunningGateway) -> str:
    assert gateway.service is not None
    return f"amqps://guest:guest@localhost:{gateway.service.tls_port}/%2F"


class _TlsConsumer(threading.Thread):
    """Raw pika over TLS: consume ``queue`` until ``expected`` bodies or ``stop``."""

    def __init__(self, url: str, context: ssl.SSLContext, queue: str, expected: int) -> None:
        super().__init__(name="tls-consumer", daemon=True)
        parameters = pika.URLParameters(url)
        parameters.ssl_options = pika.SSLOptions(context, "localhost")
        self._parameters = parameters
        self._queue = queue
        self._expected = expected
        self.bodies: list[bytes] = []
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(self._parameters)
            try:
                channel = connection.channel()
                channel.queue_declare(self._queue)
                channel.basic_qos(prefetch_count=200)
                self.ready.set()
                for method, _properties, body in channel.consume(
                    self._queue, inactivity_timeout=0.2
                ):
                    if method is not None:
                        self.bodies.append(body)
                        channel.basic_ack(method.delivery_tag)
                    if len(self.bodies) >= self._expected or self.stop.is_set():
                        break
                channel.cancel()
                channel.queue_delete(self._queue)
            finally:
                connection.close()
        except BaseException as exc:
            self.error = exc
            self.ready.set()


@pytest.mark.slow
def test_sdk_producer_over_amqps_reaches_a_tls_pika_consumer_exactly_once_in_order(
    tls_gateway: RunningGateway, ca: CertificateAuthority
) -> None:
    queue = f"rf-tls-sdk-{uuid.uuid4().hex[:10]}"
    url = _amqps(tls_gateway)
    consumer = _TlsConsumer(url, ca.client_context(), queue, MESSAGES)
    consumer.start()
    wait_for(consumer.ready.is_set, timeout=30, what="the TLS consumer")
    assert consumer.error is None, repr(consumer.error)
    try:
        factory = rabbitflow.ConnectionFactory(url, ssl_context=ca.client_context())
        with factory.create_connection() as connection:
            session = connection.create_session()
            producer = session.create_producer(session.create_queue(queue), capacity=100)
            for number in range(MESSAGES):
                producer.send(session.create_text_message(str(number)))
            producer.close()
        consumer.join(timeout=120)
    finally:
        consumer.stop.set()

    assert consumer.error is None, repr(consumer.error)
    assert consumer.bodies == [str(n).encode() for n in range(MESSAGES)]


def test_sdk_ca_file_property_connects_over_amqps(
    tls_gateway: RunningGateway, ca: CertificateAuthority
) -> None:
    queue = f"rf-tls-ca-file-{uuid.uuid4().hex[:10]}"
    factory = rabbitflow.ConnectionFactory(
        _amqps(tls_gateway), properties={"rabbitflow.ssl.ca_file": str(ca.cert)}
    )
    try:
        with factory.create_connection() as connection:
            connection.start()
            session = connection.create_session()
            destination = session.create_queue(queue)
            with session.create_producer(destination) as producer:
                producer.send(session.create_text_message("over tls"))
            received = session.create_consumer(destination).receive(timeout=10)
    finally:
        cleanup = tls_gateway.connect()
        try:
            cleanup.channel().queue_delete(queue)
        finally:
            cleanup.close()

    assert isinstance(received, rabbitflow.TextMessage)
    assert received.text == "over tls"


def test_sdk_client_that_does_not_trust_the_ca_gets_a_tls_error_saying_so(
    tls_gateway: RunningGateway, tmp_path: Path
) -> None:
    stranger = make_ca(tmp_path / "other", name="stranger")
    factory = rabbitflow.ConnectionFactory(
        _amqps(tls_gateway), ssl_context=stranger.client_context()
    )

    with pytest.raises(rabbitflow.TLSError, match="certificate verif") as raised:
        factory.create_connection()

    assert isinstance(raised.value, rabbitflow.JMSException)
