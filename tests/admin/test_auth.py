"""Admin API authentication: configured users, RabbitMQ's users, and the audit log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from rabbitflow_broker.admin.api import ANONYMOUS, RabbitMQUsers, StaticUsers
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve, seen_vhosts


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


ALICE = basic("alice", "s3cret")


def _users_service(make_service: Callable[..., GatewayService]) -> GatewayService:
    return make_service(admin_users="alice:s3cret,bob:hunter2")


@pytest.mark.asyncio
async def test_missing_credentials_get_401_with_a_basic_challenge(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        response = await client.get("/api/queues")

    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Basic realm=")


@pytest.mark.asyncio
async def test_wrong_password_gets_401(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        response = await client.get("/api/queues", headers=basic("alice", "hunter2"))

    assert response.status == 401


@pytest.mark.asyncio
async def test_unknown_user_gets_401(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        response = await client.get("/api/queues", headers=basic("mallory", "s3cret"))

    assert response.status == 401


@pytest.mark.asyncio
async def test_malformed_authorization_header_gets_401(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        response = await client.get("/api/queues", headers={"Authorization": "Basic !!notb64"})

    assert response.status == 401


@pytest.mark.asyncio
async def test_configured_user_is_let_in_everywhere(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        statuses = [
            (await client.get(path, headers=ALICE)).status
            for path in ("/api/queues", "/api/channels", "/api/store", "/metrics", "/")
        ]

    assert statuses == [200] * 5


@pytest.mark.asyncio
async def test_metrics_and_console_need_credentials_too(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(_users_service(make_service)) as client:
        statuses = [(await client.get(path)).status for path in ("/metrics", "/")]

    assert statuses == [401, 401]


@pytest.mark.asyncio
async def test_static_users_compare_passwords_exactly() -> None:
    users = StaticUsers({"alice": "s3cret"})

    assert [
        await users.check("alice", "s3cret"),
        await users.check("alice", "s3cret "),
        await users.check("alice", ""),
        await users.check("", "s3cret"),
    ] == [True, False, False, False]


@pytest.mark.asyncio
async def test_mutating_call_is_audited_with_the_user(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _users_service(make_service)
    seen_vhosts(service, "/")
    async with serve(service) as client:
        with capture_logs() as logs:
            response = await client.post("/api/producers/stop", json={"vhost": "/"}, headers=ALICE)

    assert response.status == 200
    audit = [entry for entry in logs if entry.get("action") == "stop-producers"]
    assert [(entry["user"], entry["vhost"]) for entry in audit] == [("alice", "/")]


@pytest.mark.asyncio
async def test_threshold_change_is_audited_as_anonymous_without_auth(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    service.gateway.queue_declared("/", "orders", {})
    async with serve(service) as client:
        with capture_logs() as logs:
            response = await client.put(
                "/api/queues/%2F/orders/flow", json={"flowStopCount": 10, "flowResumeCount": 5}
            )

    assert response.status == 200
    audit = [entry for entry in logs if entry.get("action") == "set-flow"]
    assert audit[0]["user"] == ANONYMOUS
    assert (audit[0]["queue"], audit[0]["flowStopCount"]) == ("orders", 10)


@pytest.mark.asyncio
async def test_reads_are_not_audited(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(make_service()) as client:
        with capture_logs() as logs:
            await client.get("/api/queues")

    assert [entry for entry in logs if "action" in entry] == []


# -- RabbitMQ's users ----------------------------------------------------------------


class FakeManagement:
    """``GET /api/whoami`` answering 200 only for alice:s3cret; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def whoami(self, request: web.Request) -> web.Response:
        self.calls += 1
        if request.headers.get("Authorization") == ALICE["Authorization"]:
            return web.json_response({"name": "alice", "tags": ["administrator"]})
        return web.json_response({"error": "not_authorised"}, status=401)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def management() -> AsyncIterator[tuple[FakeManagement, str]]:
    fake = FakeManagement()
    app = web.Application()
    app.router.add_get("/api/whoami", fake.whoami)
    server = TestServer(app)
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.mark.asyncio
async def test_rabbitmq_users_accept_credentials_rabbitmq_accepts(
    management: tuple[FakeManagement, str],
) -> None:
    _, url = management
    users = RabbitMQUsers(url)
    try:
        assert await users.check("alice", "s3cret")
        assert not await users.check("alice", "wrong")
    finally:
        await users.close()


@pytest.mark.asyncio
async def test_rabbitmq_answers_are_cached_for_the_ttl(
    management: tuple[FakeManagement, str],
) -> None:
    fake, url = management
    clock = Clock()
    users = RabbitMQUsers(url, ttl=5.0, monotonic=clock)
    try:
        await users.check("alice", "s3cret")
        clock.now += 4.9
        await users.check("alice", "s3cret")
        calls_within_ttl = fake.calls
        clock.now += 0.2
        await users.check("alice", "s3cret")
    finally:
        await users.close()

    assert (calls_within_ttl, fake.calls) == (1, 2)


@pytest.mark.asyncio
async def test_a_different_password_is_not_served_from_the_cache(
    management: tuple[FakeManagement, str],
) -> None:
    _, url = management
    users = RabbitMQUsers(url, monotonic=Clock())
    try:
        await users.check("alice", "s3cret")
        assert not await users.check("alice", "guess")
    finally:
        await users.close()


@pytest.mark.asyncio
async def test_unreachable_management_api_refuses(unused_tcp_port: int) -> None:
    users = RabbitMQUsers(f"http://127.0.0.1:{unused_tcp_port}")
    try:
        assert not await users.check("alice", "s3cret")
    finally:
        await users.close()


@pytest.mark.asyncio
async def test_admin_api_with_rabbitmq_auth_checks_rabbitmq(
    make_service: Callable[..., GatewayService],
    serve: Serve,
    management: tuple[FakeManagement, str],
) -> None:
    _, url = management
    service = make_service(admin_auth="rabbitmq", management_url=url)
    async with serve(service) as client:
        good = await client.get("/api/queues", headers=ALICE)
        bad = await client.get("/api/queues", headers=basic("alice", "nope"))

    assert (good.status, bad.status) == (200, 401)
