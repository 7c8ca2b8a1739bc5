"""Admin API input the handlers must answer for: huge thresholds, encoded names,
a failing management API."""

from __future__ import annotations

import io
import urllib.error
from collections.abc import Callable
from email.message import Message

import pytest

from rabbitflow_broker.admin.security import LoginThrottle
from rabbitflow_broker.cli.config_client import _http_error
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve


@pytest.mark.asyncio
async def test_a_threshold_past_amqps_largest_integer_is_refused_and_metrics_stay_up(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    service.gateway.routing.declare_queue("/", "q", {})
    service.gateway.queue_declared("/", "q", {})
    async with serve(service) as client:
        refused = await client.put("/api/queues/%2F/q/flow", json={"flowStopCount": 10**400})
        body = await refused.json()
        largest = await client.put("/api/queues/%2F/q/flow", json={"flowStopCount": 2**63 - 1})
        metrics = await client.get("/metrics")

    assert refused.status == 400
    assert body["error"].startswith("flowStopCount: must be at most 9223372036854775807")
    assert largest.status == 200
    assert metrics.status == 200


@pytest.mark.asyncio
async def test_a_queue_name_holding_a_percent_escape_is_that_queue(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    for name in ("a%41", "aA"):
        service.gateway.routing.declare_queue("/", name, {})
        service.gateway.queue_declared("/", name, {})
    async with serve(service) as client:
        got = await (await client.get("/api/queues/%2F/a%2541")).json()
        put = await client.put("/api/queues/%2F/a%2541/flow", json={"flowStopCount": 10})
        put_body = await put.json()
        other = await (await client.get("/api/queues/%2F/aA")).json()

    assert got["name"] == "a%41"
    assert (put.status, put_body["name"], put_body["flowStopCount"]) == (200, "a%41", 10)
    assert other["flowStopCount"] != 10  # the other queue was not touched


@pytest.mark.asyncio
async def test_a_failing_management_api_is_503_not_an_unknown_queue(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(management_url="http://127.0.0.1:9")  # nothing listens there
    async with serve(service) as client:
        answer = await client.get("/api/queues/%2F/never-seen")
        body = await answer.json()

    assert answer.status == 503
    assert "management API failed" in body["error"]


def test_logins_being_checked_count_toward_the_limit() -> None:
    throttle = LoginThrottle(limit=3, window=60.0)
    for _ in range(3):  # three guesses at once, none answered yet
        assert throttle.allowed("10.0.0.1", 0.0)
        throttle.begin("10.0.0.1")
    assert not throttle.allowed("10.0.0.1", 0.0)
    throttle.end("10.0.0.1")  # a good one: no failure recorded
    assert throttle.allowed("10.0.0.1", 0.0)
    assert throttle.allowed("10.0.0.2", 0.0)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (403, b'{"error": "Host \'vm:25874\' is not this admin API"}', "(403): Host 'vm:25874'"),
        (401, b'{"error": "wrong user or password"}', "refused the credentials (401)"),
        (403, b"", "refused the credentials (403)"),
    ],
)
def test_the_cli_says_why_the_admin_api_refused(status: int, body: bytes, said: str) -> None:
    error = urllib.error.HTTPError(
        "http://gw/api/queues", status, "Forbidden", Message(), io.BytesIO(body)
    )
    assert said in str(_http_error("GET", "/api/queues", error))
