"""Producer stop/start, store view and the console's files over real HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rabbitflow_broker.server.persistence import FileThresholdStore
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import FakeVhosts, Serve, seen_vhosts

#: A management API address where nothing listens (refused at once).
NO_MANAGEMENT = "http://127.0.0.1:9"


@pytest.fixture
def billing_unseen(
    make_service: Callable[..., GatewayService], vhost_management: tuple[FakeVhosts, str]
) -> tuple[FakeVhosts, GatewayService]:
    """A service asking the fake management API, which has the vhost
    "billing" the gateway's routing snapshot lacks; and that fake."""
    fake, url = vhost_management
    fake.vhosts.add("billing")
    return fake, make_service(management_url=url)


@pytest.mark.asyncio
async def test_stop_producers_of_one_queue_blocks_that_queue(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    seen_vhosts(service, "/")
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
    seen_vhosts(service, "/")
    async with serve(service) as client:
        await client.post("/api/producers/stop", json={"vhost": "/"})
        response = await client.post("/api/producers/start", json={"vhost": "/"})
        body = await response.json()

    assert body["stops"] == []
    assert not service.gateway.is_blocked("/", "q")


@pytest.mark.parametrize(
    "body", [{"vhost": "no-such-vhost"}, {"vhost": "no-such-vhost", "queue": "q"}]
)
@pytest.mark.asyncio
async def test_stop_producers_of_a_vhost_rabbitmq_lacks_is_404_and_stores_nothing(
    make_service: Callable[..., GatewayService],
    serve: Serve,
    vhost_management: tuple[FakeVhosts, str],
    tmp_path: Path,
    body: dict[str, Any],
) -> None:
    _, url = vhost_management
    state = tmp_path / "state.json"
    service = make_service(management_url=url, state_file=str(state))
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json=body)
        answer = await response.json()

    assert (response.status, answer) == (404, {"error": "vhost 'no-such-vhost' not found"})
    assert service.gateway.admin_stops() == []
    assert await FileThresholdStore(state).load_stops() == []


@pytest.mark.asyncio
async def test_stop_producers_of_a_vhost_only_rabbitmq_has_seen_is_accepted(
    serve: Serve, billing_unseen: tuple[FakeVhosts, GatewayService]
) -> None:
    """A vhost created since the gateway's last routing snapshot."""
    _, service = billing_unseen
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json={"vhost": "billing"})

    assert response.status == 200
    assert service.gateway.admin_stops() == [{"vhost": "billing", "queue": None}]


@pytest.mark.asyncio
async def test_stop_producers_of_an_unseen_vhost_is_503_while_the_management_api_fails(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(management_url=NO_MANAGEMENT)
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json={"vhost": "billing"})
        answer = await response.json()

    assert response.status == 503
    assert answer["error"].startswith(
        "vhost 'billing' is not known to the gateway and the management API failed"
    )
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_stop_producers_of_a_vhost_in_the_routing_snapshot_needs_no_management_api(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(management_url=NO_MANAGEMENT)
    seen_vhosts(service, "/", "billing")
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json={"vhost": "billing"})

    assert response.status == 200
    assert service.gateway.is_blocked("billing", "q")


@pytest.mark.asyncio
async def test_start_producers_lifts_the_stop_of_a_vhost_deleted_since(
    serve: Serve, billing_unseen: tuple[FakeVhosts, GatewayService]
) -> None:
    fake, service = billing_unseen
    async with serve(service) as client:
        await client.post("/api/producers/stop", json={"vhost": "billing"})
        fake.vhosts.discard("billing")
        response = await client.post("/api/producers/start", json={"vhost": "billing"})

    assert response.status == 200
    assert service.gateway.admin_stops() == []


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
