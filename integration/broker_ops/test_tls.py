"""AMQPS: the gateway's --listen-tls with a throwaway CA made in the test.

Clients are raw pika over TLS; the certificates come from
:mod:`integration.broker_ops._tls` (the ``openssl`` command line).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from integration.broker.conftest import RunningGateway, wait_for
from integration.broker_ops._tls import CertificateAuthority, Issued, make_ca
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
MESSAGES = 300


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return make_ca(tmp_path / "pki")


@pytest.fixture
def server_cert(ca: CertificateAuthority) -> Issued:
    return ca.issue("server")


def _parameters(port: int, context: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "localhost",
        port,
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(context, "localhost"),
        connection_attempts=1,
        socket_timeout=10,
    )


def _round_trip(connection: pika.BlockingConnection, count: int) -> list[bytes]:
    """Publish ``count`` confirmed messages to a new queue and consume them back."""
    queue = f"rf-tls-{uuid.uuid4().hex[:10]}"
    channel = connection.channel()
    channel.queue_declare(queue)
    try:
        channel.confirm_delivery()
        for number in range(count):
            channel.basic_publish("", queue, str(number).encode())
        received: list[bytes] = []
        for _method, _properties, body in channel.consume(queue, inactivity_timeout=5):
            if body is None:
                break
            received.append(body)
            if len(received) == count:
                break
        channel.cancel()
        return received
    finally:
        channel.queue_delete(queue)
        channel.close()


def _tls_gateway(
    gateway_factory: Callable[..., RunningGateway], cert: Issued, **options: object
) -> RunningGateway:
    return gateway_factory(
        listen_tls="127.0.0.1:0", tls_cert=str(cert.cert), tls_key=str(cert.key), **options
    )


def test_pika_over_tls_gets_every_message_exactly_once_in_order(
    gateway_factory: Callable[..., RunningGateway],
    ca: CertificateAuthority,
    server_cert: Issued,
) -> None:
    gateway = _tls_gateway(gateway_factory, server_cert)
    assert gateway.service is not None
    port = gateway.service.tls_port

    connection = pika.BlockingConnection(_parameters(port, ca.client_context()))
    try:
        received = _round_trip(connection, MESSAGES)
    finally:
        connection.close()

    assert received == [str(n).encode() for n in range(MESSAGES)]


def test_client_that_does_not_trust_the_ca_cannot_connect(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path, server_cert: Issued
) -> None:
    gateway = _tls_gateway(gateway_factory, server_cert)
    assert gateway.service is not None
    stranger = make_ca(tmp_path / "other", name="stranger")

    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        pika.BlockingConnection(_parameters(gateway.service.tls_port, stranger.client_context()))


def test_client_ca_refuses_a_client_without_a_certificate(
    gateway_factory: Callable[..., RunningGateway],
    ca: CertificateAuthority,
    server_cert: Issued,
) -> None:
    gateway = _tls_gateway(gateway_factory, server_cert, tls_client_ca=str(ca.cert))
    assert gateway.service is not None

    # TLS 1.3 reports the refusal after the handshake: as an alert or a dropped connection.
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)):
        _round_trip(
            pika.BlockingConnection(_parameters(gateway.service.tls_port, ca.client_context())), 1
        )


def test_client_ca_lets_a_client_with_a_signed_certificate_in(
    gateway_factory: Callable[..., RunningGateway],
    ca: CertificateAuthority,
    server_cert: Issued,
) -> None:
    gateway = _tls_gateway(gateway_factory, server_cert, tls_client_ca=str(ca.cert))
    assert gateway.service is not None
    context = ca.client_context(ca.issue("client", common_name="producer-1"))

    connection = pika.BlockingConnection(_parameters(gateway.service.tls_port, context))
    try:
        received = _round_trip(connection, 10)
    finally:
        connection.close()

    assert len(received) == 10


# -- certificate rotation (SIGHUP) on a real rabbitflow-broker process ---------------


def _peer_serial(port: int, ca: CertificateAuthority) -> int:
    context = ca.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert()
        assert der is not None
        return int(str(der["serialNumber"]), 16)


def _serial(cert: Path) -> int:
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-serial"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return int(out.strip().partition("=")[2], 16)


@pytest.fixture
def tls_process(
    broker: Broker, ca: CertificateAuthority, server_cert: Issued, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], int, Path, Path]]:
    """``rabbitflow-broker --listen none --listen-tls ...`` on copies of the server files."""
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    live_cert.write_bytes(server_cert.cert.read_bytes())
    live_key.write_bytes(server_cert.key.read_bytes())
    port = free_port()
    log = tmp_path / "gateway.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                BROKER_CLI,
                "--listen",
                "none",
                "--listen-tls",
                f"127.0.0.1:{port}",
                "--tls-cert",
                str(live_cert),
                "--tls-key",
                str(live_key),
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url or "http://127.0.0.1:15672",
            ],
            stderr=stderr,
            text=True,
            env=environ,
        )
    try:
        wait_for(
            lambda: all(line in log.read_text() for line in ("gateway ready", "gateway listening")),
            timeout=30,
            what="gateway listening and ready",
        )
        yield process, port, live_cert, live_key
    finally:
        process.terminate()
        process.wait(30)


def test_sighup_reloads_the_certificate_and_keeps_open_connections(
    tls_process: tuple[subprocess.Popen[str], int, Path, Path],
    ca: CertificateAuthority,
    server_cert: Issued,
) -> None:
    process, port, live_cert, live_key = tls_process
    before = pika.BlockingConnection(_parameters(port, ca.client_context()))
    assert _peer_serial(port, ca) == _serial(server_cert.cert)
    rotated = ca.issue("rotated")
    live_cert.write_bytes(rotated.cert.read_bytes())
    live_key.write_bytes(rotated.key.read_bytes())

    process.send_signal(signal.SIGHUP)

    wait_for(
        lambda: _peer_serial(port, ca) == _serial(rotated.cert),
        timeout=20,
        what="the rotated certificate served",
    )
    try:
        assert len(_round_trip(before, 20)) == 20
    finally:
        before.close()


def test_listen_none_serves_only_tls(
    tls_process: tuple[subprocess.Popen[str], int, Path, Path], ca: CertificateAuthority
) -> None:
    _process, port, live_cert, _key = tls_process
    log = (live_cert.parent / "gateway.log").read_text()
    listening = next(line for line in log.splitlines() if "gateway listening" in line)

    connection = pika.BlockingConnection(_parameters(port, ca.client_context()))
    connection.close()

    assert f"listen_tls=127.0.0.1:{port}" in listening
    assert " listen=" not in listening
