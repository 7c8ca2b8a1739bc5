"""Integration harness: real RabbitMQ brokers for the tests.

Fixtures
--------
``broker`` (session)
    A :class:`Broker` for the shared RabbitMQ: ``$RABBITMQ_URL`` when set
    (management API at ``$RABBITMQ_MANAGEMENT_URL``, else port 15672 of the
    same host), else the local node on 127.0.0.1:5672, else a RabbitMQ container
    (testcontainers) when a Docker engine answers, else a throwaway node.
    Ready only once it answers an AMQP handshake.  Never stopped or
    reconfigured by a test.
``throwaway_broker`` (function)
    A private node (own node name, ports, data dir, config; see
    :class:`rabbitflow_broker.server.rabbitmq_node.RabbitMQNode`) for tests that
    stop, restart or alarm a broker.  Management plugin enabled.  A test
    that uses it is marked ``slow`` (a node takes seconds to start).
``gateway_url`` (function)
    The AMQP URL of a gateway, its own ``rabbitflow-broker`` process in
    front of ``broker`` as an operator runs it.  Its log is printed when the
    fixture ends, so a failing test shows what the gateway did.
``unique_name`` (function)
    A factory of unique queue/exchange names; ``cleanup_queues`` deletes
    the queues a test registered on the shared broker.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from rabbitflow_broker.server.rabbitmq_node import (
    NodeError,
    RabbitMQNode,
    amqp_handshake_ok,
    free_port,
    host_port,
    rabbitmq_available,
    wait_for_amqp,
)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@dataclass(frozen=True)
class Broker:
    """Where a test's RabbitMQ is: AMQP URL, management URL, and the node when we own it."""

    url: str
    management_url: str | None
    node: RabbitMQNode | None = None

    @property
    def host(self) -> str:
        return host_port(self.url)[0]

    @property
    def port(self) -> int:
        return host_port(self.url)[1]

    def blocking_connection(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))


def _docker_engine_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    url = os.environ.get("RABBITMQ_URL")
    if url:
        host, port = host_port(url)
        if not amqp_handshake_ok(host, port, timeout=5):
            pytest.fail(f"RABBITMQ_URL={url} does not answer an AMQP handshake")
        # RabbitMQ's management plugin listens on 15672 of the same host unless
        # told otherwise; the gateway fixtures fail (not skip) if it does not answer.
        management = os.environ.get("RABBITMQ_MANAGEMENT_URL") or f"http://{host}:15672"
        yield Broker(url, management)
        return
    if amqp_handshake_ok("127.0.0.1", 5672, timeout=5):
        yield Broker(DEFAULT_URL, "http://127.0.0.1:15672")
        return
    if _docker_engine_answers():
        from testcontainers.rabbitmq import RabbitMqContainer

        with RabbitMqContainer("rabbitmq:3.13-management") as container:
            params = container.get_connection_params()
            url = f"amqp://guest:guest@{params.host}:{params.port}/%2F"
            mgmt_port = container.get_exposed_port(15672)
            yield Broker(url, f"http://{params.host}:{mgmt_port}")
        return
    if rabbitmq_available():
        with RabbitMQNode(management=True) as node:
            yield Broker(node.url, node.management_url, node)
        return
    pytest.fail(
        "no RabbitMQ reachable and rabbitmq-server is not installed (run scripts/bootstrap)"
    )


#: Fixtures that start throwaway RabbitMQ nodes (seconds each): their tests
#: count as ``slow``, which the quick loop (``-m "not slow"``) leaves out.
NODE_FIXTURES = frozenset({"throwaway_broker"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if NODE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def throwaway_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if not rabbitmq_available():
        pytest.fail("rabbitmq-server is not installed: apt-get install rabbitmq-server")
    base = tmp_path_factory.mktemp("node")
    node = RabbitMQNode(management=True, base_dir=base)
    try:
        node.start()
    except NodeError as exc:
        node.close()
        pytest.fail(f"throwaway RabbitMQ node failed to start: {exc}")
    try:
        yield Broker(node.url, node.management_url, node)
    finally:
        node.close()


@pytest.fixture
def gateway_url(broker: Broker, tmp_path: Path) -> Iterator[str]:
    """The AMQP URL of a gateway (its own process) in front of ``broker``."""
    if broker.management_url is None:
        pytest.fail("the gateway needs RabbitMQ's management API: set RABBITMQ_MANAGEMENT_URL")
    port = free_port()
    log_path = tmp_path / "gateway.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rabbitflow_broker.cli",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url,
                "--state-file",
                str(tmp_path / "gateway-state.json"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait_for_amqp("127.0.0.1", port, 30)
            yield f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        finally:
            process.terminate()
            process.wait(10)
            # Captured by pytest and shown only for a test that failed.
            sys.stderr.write(f"--- gateway log ({log_path}) ---\n{log_path.read_text()}")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    test = request.node.name.replace("[", "-").replace("]", "")[:40]

    def make(prefix: str = "q") -> str:
        return f"rf-{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def cleanup_queues(broker: Broker) -> Iterator[list[str]]:
    """Append queue names to the yielded list; they are deleted after the test."""
    names: list[str] = []
    yield names
    if not names:
        return
    with contextlib.suppress(Exception):
        connection = broker.blocking_connection()
        try:
            for name in names:
                channel = connection.channel()
                with contextlib.suppress(Exception):
                    channel.queue_delete(name)
                with contextlib.suppress(Exception):
                    channel.close()
        finally:
            connection.close()


@pytest.fixture
def new_queue(unique_name: Callable[[str], str], cleanup_queues: list[str]) -> Callable[[str], str]:
    """A queue name unique to the test (``prefix`` first), deleted after it."""

    def make(prefix: str = "q") -> str:
        name = unique_name(prefix)
        cleanup_queues.append(name)
        return name

    return make
