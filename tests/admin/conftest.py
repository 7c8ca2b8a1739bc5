"""In-process admin API fixtures: a gateway without listeners, served by aiohttp's test server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rabbitflow_broker.admin.api import Authenticator, create_app
from rabbitflow_broker.engine.routing import RoutingTable
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import BlockedChannel
from rabbitflow_broker.server.service import EventSink, GatewayService


class ListSink(EventSink):
    """Keeps events in memory instead of writing them."""

    def __init__(self) -> None:
        super().__init__(None)
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)


class FakeConnection:
    """A relay as the gateway sees it: fixed blocked channels and held confirms."""

    def __init__(self, number: int, blocked: Iterable[BlockedChannel] = (), held: int = 0) -> None:
        self.number = number
        self._blocked = list(blocked)
        self._held = held

    def held_confirms(self) -> int:
        return self._held

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        return list(self._blocked)

    def channel_count(self) -> int:
        return len(self._blocked)

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        return [{**c.to_json(), "flowStopped": True} for c in self._blocked]

    def count_unacked(self, into: dict[tuple[str, str], int]) -> None:
        return None


Serve = Callable[..., AbstractAsyncContextManager[TestClient[Any, Any]]]


def seen_vhosts(service: GatewayService, *vhosts: str) -> None:
    """Give the gateway a routing snapshot listing these vhosts (each has its
    default exchange, as RabbitMQ's ``GET /api/exchanges`` lists it)."""
    exchanges = [{"vhost": vhost, "name": "", "type": "direct"} for vhost in vhosts]
    service.gateway.routing.replace(RoutingTable.from_management(exchanges, [], []))


class FakeVhosts:
    """RabbitMQ's management API as the admin API asks it about vhosts:
    ``GET /api/vhosts/{name}`` is 200 for the vhosts in :attr:`vhosts`, else
    404 (as RabbitMQ answers)."""

    def __init__(self, *vhosts: str) -> None:
        self.vhosts = set(vhosts)

    async def vhost(self, request: web.Request) -> web.Response:
        name = unquote(request.rel_url.raw_parts[3])  # ("/", "api", "vhosts", name)
        if name in self.vhosts:
            return web.json_response({"name": name})
        return web.json_response({"error": "Object Not Found", "reason": "Not Found"}, status=404)


@pytest_asyncio.fixture
async def vhost_management() -> AsyncIterator[tuple[FakeVhosts, str]]:
    """A fake management API holding vhost ``/``, and its URL."""
    fake = FakeVhosts("/")
    app = web.Application()
    app.router.add_get("/api/vhosts/{name}", fake.vhost)
    server = TestServer(app)
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
def make_service(tmp_path: Path) -> Callable[..., GatewayService]:
    def make(**options: Any) -> GatewayService:
        options.setdefault("state_file", str(tmp_path / "thresholds.json"))
        return GatewayService(GatewayConfig(**options), sink=ListSink())

    return make


@pytest.fixture
def serve() -> Serve:
    @asynccontextmanager
    async def run(
        service: GatewayService, authenticator: Authenticator | None = None
    ) -> AsyncIterator[TestClient[Any, Any]]:
        client: TestClient[Any, Any] = TestClient(
            TestServer(create_app(service, authenticator=authenticator))
        )
        async with client:
            yield client
        await service.management.close()

    return run
