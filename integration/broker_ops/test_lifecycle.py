"""Start-up whatever the management API does, the listen backlog, stops across restarts."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pika
import pika.exceptions
import pytest
import pytest_asyncio

from integration.broker.conftest import RunningGateway
from integration.conftest import Broker
from rabbitflow_broker.admin.api import create_app
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.server.service import GatewayService


@pytest_asyncio.fixture
async def silent_management() -> AsyncIterator[str]:
    """A management URL that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    for writer in held:
        writer.close()
    server.close()


def _connect_outcome(port: int) -> str:
    """'working', or the close code and text a client gets from the gateway."""
    parameters = pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{port}/%2F?connection_attempts=1&socket_timeout=5"
    )
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return f"{exc.reply_code} {exc.reply_text}"
    except pika.exceptions.AMQPConnectionError as exc:
        # A Connection.Close before Connection.Start: pika wraps it, text and all.
        return str(exc)
    try:
        channel = connection.channel()
        channel.queue_declare("", exclusive=True)
    finally:
        connection.close()
    return "working"


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.asyncio
async def test_listener_serves_within_a_second_when_the_management_api_never_answers(
    broker: Broker, silent_management: str, tmp_path: Path
) -> None:
    config = GatewayConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        upstream=broker.url,
        management_url=silent_management,
        state_file=str(tmp_path / "state.json"),
    )
    service = GatewayService(config, admin_app=create_app)
    try:
        await asyncio.wait_for(service.start(), timeout=1.0)
        outcome = await asyncio.to_thread(_connect_outcome, service.port)
        admin = f"http://127.0.0.1:{service.admin_port}"
        statuses = await asyncio.to_thread(
            lambda: [_get(f"{admin}/api/queues"), _get(f"{admin}/api/queues/%2F/nowhere")]
        )
        reason = service.gateway.ready_error
    finally:
        await service.stop()

    assert outcome == "working" or ("320" in outcome and "management API" in outcome), outcome
    assert reason is not None
    assert silent_management in reason
    assert statuses == [200, 503]


def test_listen_backlog_is_1024_by_default(gateway: RunningGateway) -> None:
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{gateway.port}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    # For a listening socket, ss prints the backlog in the Send-Q column.
    send_q = int(out.split()[2])

    assert send_q == 1024


def test_listen_backlog_option_sets_the_backlog(
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    gateway = gateway_factory(listen_backlog=2048)
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{gateway.port}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout

    assert int(out.split()[2]) == 2048


def test_administrator_stop_survives_a_gateway_restart(
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    # One unique queue: a stop kept in the shared RabbitMQ must not block anyone else.
    queue = f"rf-stop-{uuid.uuid4().hex[:10]}"
    gateway = gateway_factory()
    status, _ = gateway.http("POST", "/api/producers/stop", {"vhost": "/", "queue": queue})
    assert status == 200
    try:
        gateway.restart()
        _, store = gateway.http("GET", "/api/store")
        service = gateway.service
        assert service is not None
        blocked = gateway.call(lambda: service.gateway.is_blocked("/", queue))
    finally:
        gateway.http("POST", "/api/producers/start", {"vhost": "/", "queue": queue})

    assert {"vhost": "/", "queue": queue} in store["stops"]
    assert blocked


def test_administrator_start_is_remembered_across_a_restart_too(
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    queue = f"rf-stop-{uuid.uuid4().hex[:10]}"
    gateway = gateway_factory()
    gateway.http("POST", "/api/producers/stop", {"vhost": "/", "queue": queue})
    gateway.http("POST", "/api/producers/start", {"vhost": "/", "queue": queue})

    gateway.restart()
    _, store = gateway.http("GET", "/api/store")

    assert {"vhost": "/", "queue": queue} not in store["stops"]
