"""The gateway's admin HTTP API (aiohttp).

``GET /api/queues``, ``GET /api/queues/{vhost}/{name}`` (vhost URL-encoded,
``%2F`` for ``/``), ``PUT /api/queues/{vhost}/{name}/flow`` with any subset
of ``flowStopCount``, ``flowResumeCount``, ``flowStopSize``,
``flowResumeSize``, and ``GET /api/channels``.  Errors are JSON
``{"error": "..."}`` with 400 (bad request, refused threshold) or 404
(unknown queue).  Handlers only drive the gateway.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import structlog
from aiohttp import web

from rabbitflow_broker.flow import ThresholdError
from rabbitflow_broker.persistence import PersistenceError
from rabbitflow_broker.upstream import ManagementError

if TYPE_CHECKING:
    from rabbitflow_broker.service import GatewayService

__all__ = ["SERVICE_KEY", "create_app"]

_log = structlog.get_logger("rabbitflow.broker.admin")

SERVICE_KEY: web.AppKey[GatewayService] = web.AppKey("service")


def _error(status: int, text: str) -> web.Response:
    return web.json_response({"error": text}, status=status)


def _service(request: web.Request) -> GatewayService:
    return request.app[SERVICE_KEY]


def _names(request: web.Request) -> tuple[str, str]:
    # aiohttp leaves %2F encoded inside a path segment; decode it ourselves.
    return unquote(request.match_info["vhost"]), unquote(request.match_info["name"])


async def _known(service: GatewayService, vhost: str, name: str) -> bool:
    gateway = service.gateway
    if gateway.knows_queue(vhost, name):
        return True
    try:
        item = await service.management.queue(vhost, name)
    except ManagementError:
        return False
    if item is None:
        return False
    arguments = item.get("arguments")
    policy = item.get("effective_policy_definition")
    arguments = arguments if isinstance(arguments, dict) else {}
    gateway.queue_seen(vhost, name, arguments, policy if isinstance(policy, dict) else {})
    if not gateway.routing.has_queue(vhost, name):
        gateway.routing.declare_queue(vhost, name, arguments)
    return True


async def list_queues(request: web.Request) -> web.Response:
    """GET /api/queues"""
    return web.json_response([s.to_json() for s in _service(request).gateway.snapshots()])


async def get_queue(request: web.Request) -> web.Response:
    """GET /api/queues/{vhost}/{name}"""
    service = _service(request)
    vhost, name = _names(request)
    if not await _known(service, vhost, name):
        return _error(404, f"queue {name!r} in vhost {vhost!r} not found")
    return web.json_response(service.gateway.snapshot(vhost, name).to_json())


async def put_flow(request: web.Request) -> web.Response:
    """PUT /api/queues/{vhost}/{name}/flow"""
    service = _service(request)
    vhost, name = _names(request)
    try:
        body: Any = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "body is not valid JSON")
    if not isinstance(body, dict) or not body:
        return _error(400, "body must be a JSON object with at least one threshold")
    if not await _known(service, vhost, name):
        return _error(404, f"queue {name!r} in vhost {vhost!r} not found")
    try:
        thresholds = service.gateway.set_runtime_thresholds(vhost, name, body)
    except ThresholdError as exc:
        return _error(400, str(exc))
    _log.info(
        "thresholds set",
        vhost=vhost,
        queue=name,
        peer=request.remote,
        **thresholds.to_json(),
    )
    try:
        await service.store.save((vhost, name), thresholds)
    except PersistenceError as exc:
        # Applied but not durable: say so rather than pretend.
        snapshot = service.gateway.snapshot(vhost, name).to_json()
        snapshot["warning"] = f"not persisted: {exc}"
        return web.json_response(snapshot)
    return web.json_response(service.gateway.snapshot(vhost, name).to_json())


async def list_channels(request: web.Request) -> web.Response:
    """GET /api/channels"""
    gateway = _service(request).gateway
    channels = [c for conn in gateway.connections for c in conn.describe_channels()]
    channels.sort(key=lambda c: (c["connection"], c["channel"]))
    return web.json_response(channels)


def create_app(service: GatewayService) -> web.Application:
    """The admin application for one running gateway."""
    app = web.Application()
    app[SERVICE_KEY] = service
    app.router.add_get("/api/queues", list_queues)
    app.router.add_get("/api/queues/{vhost}/{name}", get_queue)
    app.router.add_put("/api/queues/{vhost}/{name}/flow", put_flow)
    app.router.add_get("/api/channels", list_channels)
    return app
