"""``PUT /api/queues/{vhost}/{name}/flow`` with a stop value alone: a resume
value nobody set (derived from the old stop, or a default) follows the new
stop; a resume value that was set stays while it fits."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from rabbitflow_broker.server.persistence import FileThresholdStore
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve

FLOW = "/api/queues/%2F/q/flow"


def _declared(service: GatewayService, arguments: Mapping[str, object]) -> GatewayService:
    """``service`` with queue ``q`` of ``/`` declared through it with ``arguments``."""
    service.gateway.routing.declare_queue("/", "q", arguments)
    service.gateway.queue_declared("/", "q", arguments)
    return service


async def _put(client: TestClient[Any, Any], changes: Mapping[str, int]) -> tuple[int, int]:
    """PUT the changes; the (stop, resume) counts the answer shows."""
    response = await client.put(FLOW, json=changes)
    body = await response.json()
    assert response.status == 200, body
    return body["flowStopCount"], body["flowResumeCount"]


@pytest.mark.asyncio
async def test_a_new_stop_rederives_a_resume_derived_from_the_declared_stop(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _declared(make_service(), {"qpid.flow_stop_count": 1000})  # resume 875
    async with serve(service) as client:
        assert await _put(client, {"flowStopCount": 2000}) == (2000, 1750)


@pytest.mark.asyncio
async def test_a_new_stop_rederives_a_resume_derived_from_an_earlier_stop(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _declared(make_service(), {})
    async with serve(service) as client:
        first = await _put(client, {"flowStopCount": 1000})
        second = await _put(client, {"flowStopCount": 2000})

    assert (first, second) == ((1000, 875), (2000, 1750))


@pytest.mark.asyncio
async def test_a_new_stop_rederives_a_default_resume(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    maximum = {"x-max-length": 1000, "x-overflow": "reject-publish"}  # stop 800, resume 700
    service = _declared(make_service(), maximum)
    async with serve(service) as client:
        assert await _put(client, {"flowStopCount": 2000}) == (2000, 1750)


@pytest.mark.asyncio
async def test_a_new_stop_size_rederives_a_derived_resume_size(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _declared(make_service(), {})
    async with serve(service) as client:
        await client.put(FLOW, json={"flowStopSize": 10_000})
        body = await (await client.put(FLOW, json={"flowStopSize": 20_000})).json()

    assert (body["flowStopSize"], body["flowResumeSize"]) == (20_000, 17_500)


@pytest.mark.asyncio
async def test_a_new_stop_keeps_a_resume_that_was_set(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _declared(make_service(), {})
    async with serve(service) as client:
        await _put(client, {"flowStopCount": 1000, "flowResumeCount": 500})
        assert await _put(client, {"flowStopCount": 2000}) == (2000, 500)


@pytest.mark.asyncio
async def test_a_new_stop_keeps_a_resume_declared_with_the_queue(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    arguments = {"qpid.flow_stop_count": 1000, "qpid.flow_resume_count": 500}
    service = _declared(make_service(), arguments)
    async with serve(service) as client:
        assert await _put(client, {"flowStopCount": 2000}) == (2000, 500)


@pytest.mark.asyncio
async def test_a_set_resume_above_a_new_stop_is_derived_from_then_on(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _declared(make_service(), {})
    async with serve(service) as client:
        await _put(client, {"flowStopCount": 1000, "flowResumeCount": 900})
        lowered = await _put(client, {"flowStopCount": 500})
        raised = await _put(client, {"flowStopCount": 2000})

    assert (lowered, raised) == ((500, 437), (2000, 1750))


@pytest.mark.asyncio
async def test_a_derived_resume_is_stored_unset_and_follows_a_new_stop_after_a_restart(
    make_service: Callable[..., GatewayService], serve: Serve, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    service = _declared(make_service(state_file=str(state)), {})
    async with serve(service) as client:
        await _put(client, {"flowStopCount": 1000})
    stored = json.loads(state.read_text())["thresholds"]

    restarted = _declared(make_service(state_file=str(state)), {})
    restarted.gateway.load_runtime_thresholds(await FileThresholdStore(state).load())
    async with serve(restarted) as client:
        shown = await (await client.get("/api/queues/%2F/q")).json()
        raised = await _put(client, {"flowStopCount": 2000})

    assert (stored[0]["flowStopCount"], stored[0]["flowResumeCount"]) == (1000, 0)
    assert (shown["flowResumeCount"], shown["source"]) == (875, "runtime")
    assert raised == (2000, 1750)
