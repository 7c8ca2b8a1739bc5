"""``GET /api/runtime`` and what admin requests leave behind."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator

import pytest

from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import FakeConnection, Serve


@pytest.mark.asyncio
async def test_runtime_counts_tasks_connections_and_full_collections(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    async with serve(service) as client:
        before = await (await client.get("/api/runtime")).json()
        release = asyncio.Event()
        waiting = [asyncio.create_task(release.wait()) for _ in range(3)]
        service.gateway.register(FakeConnection(1))
        service.gateway.register(FakeConnection(2))
        service.collector.collect_now()
        during = await (await client.get("/api/runtime")).json()
        release.set()
        await asyncio.gather(*waiting)
        for number in (1, 2):
            service.gateway.unregister(FakeConnection(number))
        after = await (await client.get("/api/runtime")).json()

    assert during["tasks"] == before["tasks"] + 3
    assert after["tasks"] == before["tasks"]
    assert (before["connections"], during["connections"], after["connections"]) == (0, 2, 0)
    assert during["gc"]["full_collections"] == before["gc"]["full_collections"] + 1
    assert during["rssBytes"] > 0
    assert during["openFds"] > 0


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """The collector off and told to keep what it finds (in ``gc.garbage``)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.asyncio
async def test_admin_requests_leave_nothing_for_the_collector(
    make_service: Callable[..., GatewayService], serve: Serve, saved_garbage: list[object]
) -> None:
    """Reads and refused writes: every request's objects are freed by
    reference counting (a raised aiohttp error response would not be)."""
    service = make_service()
    service.gateway.ready_error = None
    service.gateway.routing.declare_queue("/", "q", {})
    service.gateway.queue_declared("/", "q", {})
    service.gateway.register(FakeConnection(1))
    paths = ["/api/queues", "/api/queues/%2F/q", "/api/channels", "/api/store"]
    paths += ["/api/ready", "/api/runtime", "/metrics", "/api/queues/%2F/unknown"]
    statuses: set[int] = set()
    async with serve(service) as client:
        for round_ in range(21):
            if round_ == 1:  # after a first round: what is made once (classes, caches)
                gc.collect()
                saved_garbage.clear()
            for path in paths:
                statuses.add((await client.get(path)).status)
            for body in ({"vhost": 3}, {"vhost": "/", "extra": 1}, [1]):
                statuses.add((await client.post("/api/producers/stop", json=body)).status)
            refused = await client.put("/api/queues/%2F/q/flow", json={"flowStopCount": -1})
            statuses.add(refused.status)
        gc.collect()

    assert statuses >= {200, 400}
    ours = [o for o in saved_garbage if not _header_class(o)]
    assert sorted({type(o).__name__ for o in ours}) == []


def _header_class(obj: object) -> bool:
    """A class the standard library's ``email.headerregistry`` makes for a
    parsed header (and its bases and MRO tuples): aiohttp parses each new
    Content-Type so, and caches the answer; not per request."""
    if isinstance(obj, type):
        return obj.__module__ == "email.headerregistry"
    return (
        isinstance(obj, tuple)
        and all(isinstance(item, type) for item in obj)
        and any(item.__module__ == "email.headerregistry" for item in obj)
    )
