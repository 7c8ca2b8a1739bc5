"""The SDK over ``amqps://``: a TLS-terminating proxy with a throwaway CA in
front of the real RabbitMQ.  (The gateway's own TLS listener is tested with
the gateway's integration tests.)"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rabbitflow

from ..conftest import Broker
from ._support import drain, numbers
from ._tls import ThrowawayCA, TlsProxy, make_ca


@pytest.fixture
def test_ca(tmp_path: Path) -> ThrowawayCA:
    return make_ca(tmp_path / "ca")


@pytest.fixture
def tls_proxy(broker: Broker, test_ca: ThrowawayCA) -> Iterator[TlsProxy]:
    with TlsProxy(test_ca, (broker.host, broker.port)) as proxy:
        yield proxy


def _send(factory: rabbitflow.ConnectionFactory, queue: str, count: int) -> None:
    with factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue))
        for n in range(1, count + 1):
            producer.send(session.create_text_message(str(n)))


def test_producer_sends_over_tls_with_the_ca_file_property(
    broker: Broker,
    tls_proxy: TlsProxy,
    test_ca: ThrowawayCA,
    new_queue: Callable[[str], str],
) -> None:
    queue = new_queue("tls")
    factory = rabbitflow.ConnectionFactory(
        tls_proxy.url(), properties={"rabbitflow.ssl.ca_file": str(test_ca.ca_file)}
    )
    _send(factory, queue, 200)
    assert numbers(drain(broker.url, queue)) == list(range(1, 201))


def test_producer_sends_over_tls_with_an_ssl_context(
    broker: Broker,
    tls_proxy: TlsProxy,
    test_ca: ThrowawayCA,
    new_queue: Callable[[str], str],
) -> None:
    queue = new_queue("tlsctx")
    context = ssl.create_default_context(cafile=str(test_ca.ca_file))
    _send(rabbitflow.ConnectionFactory(tls_proxy.url(), ssl_context=context), queue, 50)
    assert numbers(drain(broker.url, queue)) == list(range(1, 51))


def test_a_client_that_does_not_trust_the_ca_gets_a_tls_error(
    tls_proxy: TlsProxy, tmp_path: Path
) -> None:
    other = make_ca(tmp_path / "other", name="some-other-ca")
    factory = rabbitflow.ConnectionFactory(
        tls_proxy.url(), properties={"rabbitflow.ssl.ca_file": str(other.ca_file)}
    )
    with pytest.raises(rabbitflow.TLSError, match="certificate verification failed"):
        factory.create_connection()
