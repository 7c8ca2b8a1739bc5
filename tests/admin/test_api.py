"""Producer stop/start, store view and the console's files over real HTTP."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve


@pytest.mark.asyncio
async def test_stop_producers_of_one_queue_blocks_that_queue(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json={"vhost": "/", "queue": "q"})
        body = await response.json()

    assert response.status == 200
    assert body["stops"] == [{"vhost": "/", "queue": "q"}]
    assert service.gateway.is_blocked("/", "q")
    assert not service.gateway.is_blocked("/", "other")


@pytest.mark.asyncio
async def test_stop_producers_without_a_body_stops_everything(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post(
            "/api/producers/stop", headers={"Content-Type": "application/json"}
        )

    assert response.status == 200
    assert service.gateway.admin_stops() == [{"vhost": None, "queue": None}]
    assert service.gateway.is_blocked("/", "anything")


@pytest.mark.asyncio
async def test_start_producers_lifts_the_matching_stop(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        await client.post("/api/producers/stop", json={"vhost": "/"})
        response = await client.post("/api/producers/start", json={"vhost": "/"})
        body = await response.json()

    assert body["stops"] == []
    assert not service.gateway.is_blocked("/", "q")


@pytest.mark.parametrize(
    "body",
    [b"[1]", b"{not json", b'{"vhost": 3}', b'{"queue": ""}', b'{"exchange": "x"}'],
    ids=["not-an-object", "not-json", "vhost-not-a-string", "empty-queue", "unknown-key"],
)
@pytest.mark.asyncio
async def test_bad_producer_bodies_are_refused_and_change_nothing(
    make_service: Callable[..., GatewayService], serve: Serve, body: bytes
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post(
            "/api/producers/stop", data=body, headers={"Content-Type": "application/json"}
        )
        answer = await response.json()

    assert response.status == 400
    assert "error" in answer
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_store_lists_quota_stops_and_held_confirms(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(store_overfull_size=1000, store_underfull_size=500)
    service.gateway.store_quotas.observe("/", 1200, "management")
    service.gateway.stop_producers(queue="q")
    async with serve(service) as client:
        response = await client.get("/api/store")
        body = await response.json()

    assert body["vhosts"][0]["vhost"] == "/"
    assert (body["vhosts"][0]["size"], body["vhosts"][0]["overfull"]) == (1200, True)
    assert body["stops"] == [{"vhost": None, "queue": "q"}]
    assert body["heldConfirms"] == 0


@pytest.mark.asyncio
async def test_console_page_and_its_assets_are_served(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(make_service()) as client:
        page = await client.get("/")
        html = await page.text()
        script = await client.get("/static/console.js")
        style = await client.get("/static/console.css")

    assert page.status == 200
    assert page.content_type == "text/html"
    assert '<script src="/static/console.js">' in html
    assert (script.status, style.status) == (200, 200)


@pytest.mark.asyncio
async def test_console_loads_nothing_from_other_hosts(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(make_service()) as client:
        texts = [
            await (await client.get(path)).text()
            for path in ("/", "/static/console.js", "/static/console.css")
        ]

    assert not any("http://" in text or "https://" in text or "//cdn" in text for text in texts)
