"""A real gateway in front of the shared RabbitMQ, run in-process on free ports.

``gateway_factory(**options)`` starts a :class:`RunningGateway` (its own
asyncio loop in a thread) with the given :class:`GatewayConfig` options;
every gateway started is stopped after the test.  ``gateway`` is one with
default options.  Helpers wait on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pika
import pytest

from integration.conftest import Broker
from rabbitflow_broker.admin.api import create_app
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.server.service import GatewayService

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what or condition!r} (last: {last!r})")


def serving(log: Path) -> bool:
    """Whether a gateway writing ``log`` is ready and listening: it may say
    "gateway ready" before its listeners open (start-up waits a short grace
    for RabbitMQ first), and a client connecting in between is refused."""
    text = log.read_text()
    return "gateway ready" in text and "gateway listening" in text


class RunningGateway:
    """A gateway service driven by its own event loop thread."""

    def __init__(self, broker: Broker, event_log: Path, **options: Any) -> None:
        self.broker = broker
        self.event_log = event_log
        self.options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.service: GatewayService | None = None
        self.port = 0
        self.admin_port = 0
        self.listen_port = options.pop("listen_port", 0)
        self.admin_listen_port = options.pop("admin_port", 0)
        self._clients: list[pika.BlockingConnection] = []

    def start(self) -> RunningGateway:
        config = GatewayConfig(
            listen=f"127.0.0.1:{self.listen_port}",
            admin_listen=f"127.0.0.1:{self.admin_listen_port}",
            upstream=self.broker.url,
            management_url=self.broker.management_url or "http://127.0.0.1:15672",
            event_log=str(self.event_log),
            **self.options,
        )
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(loop, ready), daemon=True)
        self._thread.start()
        service = GatewayService(config, admin_app=create_app)
        self.service = service
        future = asyncio.run_coroutine_threadsafe(service.start(), loop)
        future.result(timeout=30)
        # The listener opens before the first routing snapshot when RabbitMQ is slow.
        asyncio.run_coroutine_threadsafe(service.ready.wait(), loop).result(timeout=30)
        self.port, self.admin_port = service.port, service.admin_port
        # A restart reuses the ports so clients and tests can reconnect.
        self.listen_port, self.admin_listen_port = self.port, self.admin_port
        return self

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def stop(self) -> None:
        if self._loop is None or self.service is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.service.stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None
        self.service = None

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- client side ----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def connect(self) -> pika.BlockingConnection:
        """A client connection through the gateway (closed by :meth:`close_clients`
        if the test leaves it open)."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self._clients.append(connection)
        return connection

    def close_clients(self) -> None:
        """Close the client connections a test left open (one that failed
        half-way): else their sockets are collected, with a ResourceWarning
        that fails whichever test runs then."""
        clients, self._clients = self._clients, []
        for connection in clients:
            if connection.is_open:
                with contextlib.suppress(Exception):
                    connection.close()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the gateway's loop thread (to read its state safely)."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    # -- admin API ---------------------------------------------------------------

    def http(self, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def queue(self, name: str, vhost: str = "/") -> dict[str, Any]:
        status, body = self.http("GET", f"/api/queues/{quote(vhost, safe='')}/{quote(name)}")
        assert status == 200, (status, body)
        return dict(body)

    def channels(self) -> list[dict[str, Any]]:
        status, body = self.http("GET", "/api/channels")
        assert status == 200, (status, body)
        return list(body)

    def events(self, code: str | None = None, queue: str | None = None) -> list[dict[str, Any]]:
        if not self.event_log.exists():
            return []
        records = [
            json.loads(line)
            for line in self.event_log.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        return [
            r
            for r in records
            if (code is None or r["code"] == code) and (queue is None or r.get("queue") == queue)
        ]


@pytest.fixture
def gateway_factory(broker: Broker, tmp_path: Path) -> Iterator[Callable[..., RunningGateway]]:
    started: list[RunningGateway] = []

    def make(**options: Any) -> RunningGateway:
        running = RunningGateway(
            broker, tmp_path / f"events-{len(started)}.jsonl", **options
        ).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.close_clients()
        running.stop()


@pytest.fixture
def gateway(gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory()


def with_own_store(make: Callable[..., RunningGateway], directory: Path) -> RunningGateway:
    """A gateway that keeps its runtime thresholds and administrator stops in
    a file of its own, for tests that assert on every stop a gateway holds.
    The default store, RabbitMQ's global parameters, is shared with the tests
    running beside them: a gateway that starts while another test's stop is
    stored there restores it."""
    return make(state_file=str(directory / "state.json"))
