"""Requests a web page could make a browser send: forged origin, rebound host, bad JSON."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve

JSON = {"Content-Type": "application/json"}


@pytest.mark.asyncio
async def test_cross_origin_text_plain_stop_is_refused_and_stops_nothing(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post(
            "/api/producers/stop",
            data=b"",
            headers={
                "Content-Type": "text/plain",
                "Origin": "http://evil.example",
                "Host": "evil.example",
            },
        )

    assert response.status == 403
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_mutating_request_without_json_content_type_is_refused(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post(
            "/api/producers/stop", data=b"", headers={"Content-Type": "text/plain"}
        )
        body = await response.json()

    assert response.status == 403
    assert "application/json" in body["error"]
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_json_request_from_a_foreign_origin_is_refused(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post(
            "/api/producers/stop", json={}, headers={"Origin": "http://evil.example"}
        )
        body = await response.json()

    assert response.status == 403
    assert "Origin" in body["error"]
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_json_request_from_the_admin_origin_is_accepted(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        origin = f"http://127.0.0.1:{client.port}"
        response = await client.post("/api/producers/stop", json={}, headers={"Origin": origin})

    assert response.status == 200
    assert service.gateway.admin_stops() == [{"vhost": None, "queue": None}]


@pytest.mark.asyncio
async def test_read_with_a_rebound_host_is_refused(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    async with serve(make_service()) as client:
        response = await client.get("/api/queues", headers={"Host": f"evil.example:{client.port}"})

    assert response.status == 403


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
@pytest.mark.asyncio
async def test_bound_address_and_localhost_are_accepted_hosts(
    make_service: Callable[..., GatewayService], serve: Serve, host: str
) -> None:
    async with serve(make_service()) as client:
        response = await client.get("/api/queues", headers={"Host": f"{host}:{client.port}"})

    assert response.status == 200


@pytest.mark.asyncio
async def test_name_in_admin_allowed_hosts_is_accepted(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(admin_allowed_hosts="gw.internal, Admin.Example")
    async with serve(service) as client:
        statuses = [
            (await client.get("/api/queues", headers={"Host": f"{name}:{client.port}"})).status
            for name in ("gw.internal", "admin.example", "other.example")
        ]

    assert statuses == [200, 200, 403]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"flowStopCount": ' + b"[" * 50 + b"1" + b"]" * 50 + b"}",
        b'{"flowStopCount": ' + b"9" * 100_000 + b"}",
        b"\xff\xfe",
    ],
    ids=["deeply-nested-array", "nested-value", "100000-digit-integer", "not-utf8"],
)
@pytest.mark.asyncio
async def test_malformed_threshold_body_gets_400_with_a_message(
    make_service: Callable[..., GatewayService], serve: Serve, body: bytes
) -> None:
    service = make_service()
    service.gateway.queue_seen("/", "q", {}, {})
    async with serve(service) as client:
        response = await client.put("/api/queues/%2F/q/flow", data=body, headers=JSON)
        answer = await response.json()

    assert response.status == 400
    assert answer["error"].startswith("body ")
    assert service.gateway.runtime_thresholds("/", "q") is None


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"vhost": ' + b"9" * 100_000 + b"}"],
    ids=["deeply-nested", "100000-digit-integer"],
)
@pytest.mark.asyncio
async def test_malformed_producer_scope_gets_400_and_stops_nothing(
    make_service: Callable[..., GatewayService], serve: Serve, body: bytes
) -> None:
    service = make_service()
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", data=body, headers=JSON)
        answer = await response.json()

    assert response.status == 400
    assert answer["error"]
    assert service.gateway.admin_stops() == []
