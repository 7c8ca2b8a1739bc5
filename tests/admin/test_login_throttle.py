"""Repeated failed logins from one address get 429."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from rabbitflow_broker.admin.api import LOGIN_FAILURES_ALLOWED, LoginThrottle
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve


def test_throttle_refuses_an_address_after_the_allowed_failures() -> None:
    throttle = LoginThrottle(limit=3, window=60.0)
    for second in range(3):
        assert throttle.allowed("10.0.0.1", float(second))
        throttle.failed("10.0.0.1", float(second))

    assert not throttle.allowed("10.0.0.1", 3.0)


def test_throttle_counts_each_address_separately() -> None:
    throttle = LoginThrottle(limit=2, window=60.0)
    throttle.failed("10.0.0.1", 0.0)
    throttle.failed("10.0.0.1", 0.0)

    assert throttle.allowed("10.0.0.2", 0.0)


def test_throttle_lets_an_address_in_again_once_its_failures_age_out() -> None:
    throttle = LoginThrottle(limit=2, window=60.0)
    throttle.failed("10.0.0.1", 0.0)
    throttle.failed("10.0.0.1", 10.0)

    assert not throttle.allowed("10.0.0.1", 59.0)
    assert throttle.retry_after("10.0.0.1", 59.0) == pytest.approx(1.0)
    assert throttle.allowed("10.0.0.1", 60.5)


@pytest.mark.asyncio
async def test_repeated_wrong_passwords_get_429_even_with_the_right_one_next(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service(admin_users="alice:s3cret")
    wrong = {"Authorization": aiohttp.encode_basic_auth("alice", "guess")}
    right = {"Authorization": aiohttp.encode_basic_auth("alice", "s3cret")}
    async with serve(service) as client:
        statuses = [
            (await client.get("/api/queues", headers=wrong)).status
            for _ in range(LOGIN_FAILURES_ALLOWED)
        ]
        refused = await client.get("/api/queues", headers=right)
        body = await refused.json()

    assert statuses == [401] * LOGIN_FAILURES_ALLOWED
    assert refused.status == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert "too many failed logins" in body["error"]
