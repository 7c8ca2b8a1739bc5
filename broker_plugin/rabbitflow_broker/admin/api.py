"""The gateway's admin HTTP API, metrics and web console (aiohttp).

Routes (vhosts URL-encoded in paths, ``%2F`` for ``/``):

* ``GET /api/queues``, ``GET /api/queues/{vhost}/{name}``,
  ``PUT /api/queues/{vhost}/{name}/flow`` (any subset of
  ``flowStopCount``, ``flowResumeCount``, ``flowStopSize``,
  ``flowResumeSize``), ``GET /api/channels``;
* ``GET /api/store``: the store quota of every vhost, the administrator
  stops in force and the number of held confirms;
* ``POST /api/producers/stop`` and ``/start`` with an optional JSON body
  ``{"vhost": ..., "queue": ...}`` (no body, ``{}`` or nulls: everything);
  a stop of a vhost RabbitMQ does not have is 404 (a start always lifts
  the stop with the same scope, if any);
* ``GET /api/ready``: 200 ``{"ready": true}`` once the gateway has its
  first routing snapshot, else 503 with the reason clients are refused;
* ``GET /api/runtime``: the process's resident memory, open file
  descriptors, asyncio tasks, relayed connections and the cycle
  collector's counts (:mod:`rabbitflow_broker.server.gc_policy`), to watch for
  leaks;
* ``GET /metrics`` (Prometheus text, see :mod:`rabbitflow_broker.admin.metrics`);
* ``GET /`` the web console (``static/``).

Errors are JSON ``{"error": "..."}`` with 400 (bad request, refused
threshold, malformed JSON), 401 (credentials), 403 (a request a browser
could have been tricked into sending), 404 (unknown queue or vhost), 429
(too many failed logins) or 503 (a queue or vhost the gateway has not seen,
and RabbitMQ's management API did not answer or failed: it is not known
whether it exists).

What a web page cannot make a browser do (CSRF, DNS rebinding):

* every request's ``Host`` must name the admin API itself: the address it
  is bound to (or the local address the request came in on), ``localhost``
  (``127.0.0.1``, ``::1``) or a name in ``--admin-allowed-hosts``; anything
  else is 403;
* a mutating request (POST, PUT, PATCH, DELETE) needs ``Content-Type:
  application/json`` (a browser sends that cross-origin only after a CORS
  preflight, which this API never grants) and, when it carries an
  ``Origin``, one equal to ``http(s)://<Host>``;
* more than :data:`LOGIN_FAILURES_ALLOWED` failed logins from one address
  within :data:`LOGIN_WINDOW_S` seconds get 429 until the window has passed.

Authentication (``--admin-auth``): ``none`` (only allowed on loopback;
enforced by the configuration), ``users`` (HTTP basic against
``--admin-users``, compared in constant time) or ``rabbitmq`` (HTTP basic
checked against RabbitMQ's own users with ``GET /api/whoami`` on the
management API; answers are cached for :data:`RABBITMQ_AUTH_TTL` seconds).
Every route needs the credentials.  Every mutating call is logged on
``rabbitflow.broker.audit`` with who made it.  Handlers only drive the
gateway.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from rabbitflow_broker.admin.metrics import metrics_registry, negotiate
from rabbitflow_broker.admin.security import (
    _AUTH_KEY,
    _HOSTS_KEY,
    _THROTTLE_KEY,
    ANONYMOUS,
    LOGIN_FAILURES_ALLOWED,
    LOGIN_WINDOW_S,
    RABBITMQ_AUTH_TTL,
    Authenticator,
    LoginThrottle,
    RabbitMQUsers,
    StaticUsers,
    _auth_middleware,
    _guard_middleware,
    _parse_json,
    _who,
    authenticator_for,
)
from rabbitflow_broker.engine.flow import ThresholdError
from rabbitflow_broker.server.management import ManagementError
from rabbitflow_broker.server.persistence import PersistenceError

if TYPE_CHECKING:
    from rabbitflow_broker.server.service import GatewayService

__all__ = [
    "ANONYMOUS",
    "LOGIN_FAILURES_ALLOWED",
    "LOGIN_WINDOW_S",
    "RABBITMQ_AUTH_TTL",
    "SERVICE_KEY",
    "Authenticator",
    "LoginThrottle",
    "RabbitMQUsers",
    "StaticUsers",
    "authenticator_for",
    "create_app",
]

_audit = structlog.get_logger("rabbitflow.broker.audit")

SERVICE_KEY: web.AppKey[GatewayService] = web.AppKey("service")
_REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics")

#: Seconds an admin request waits for RabbitMQ's management API before answering anyway.
ADMIN_MANAGEMENT_TIMEOUT_S = 2.0

_STATIC = Path(__file__).with_name("static")


# -- handlers -----------------------------------------------------------------------


def _error(status: int, text: str) -> web.Response:
    return web.json_response({"error": text}, status=status)


def _service(request: web.Request) -> GatewayService:
    return request.app[SERVICE_KEY]


def _names(request: web.Request) -> tuple[str, str]:
    """The vhost and queue of ``/api/queues/{vhost}/{name}...``, each decoded once.

    From the raw path: aiohttp versions differ in what of a segment they
    decode (``%2F`` kept or not), and decoding their result again turns a
    name holding ``%41`` into another queue's (``A``)."""
    parts = request.rel_url.raw_parts  # ("/", "api", "queues", vhost, name, ...)
    return unquote(parts[3]), unquote(parts[4])


class _ManagementSilent(Exception):
    """The management API did not answer within the admin API's patience, or failed."""


_T = TypeVar("_T")


async def _look_up(lookup: Awaitable[_T], unknown: str) -> _T:
    """The management API's answer about ``unknown`` (what the gateway has not seen).

    Raises:
        _ManagementSilent: RabbitMQ did not answer in time, or its answer was an error.
    """
    try:
        async with asyncio.timeout(ADMIN_MANAGEMENT_TIMEOUT_S):
            return await lookup
    except TimeoutError:
        raise _ManagementSilent(
            f"{unknown} is not known to the gateway and the management API did not "
            f"answer within {ADMIN_MANAGEMENT_TIMEOUT_S:g} s"
        ) from None
    except ManagementError as exc:
        raise _ManagementSilent(
            f"{unknown} is not known to the gateway and the management API failed: {exc}"
        ) from None


async def _known(service: GatewayService, vhost: str, name: str) -> bool:
    """Whether the queue exists; asks RabbitMQ about queues the gateway has not seen.

    Raises:
        _ManagementSilent: RabbitMQ did not answer in time, or its answer was an error.
    """
    gateway = service.gateway
    if gateway.knows_queue(vhost, name):
        return True
    item = await _look_up(
        service.management.queue(vhost, name), f"queue {name!r} in vhost {vhost!r}"
    )
    if item is None:
        return False
    arguments = item.get("arguments")
    policy = item.get("effective_policy_definition")
    arguments = arguments if isinstance(arguments, dict) else {}
    gateway.queue_seen(vhost, name, arguments, policy if isinstance(policy, dict) else {})
    if not gateway.routing.has_queue(vhost, name):
        gateway.routing.declare_queue(vhost, name, arguments)
    return True


async def _vhost_known(service: GatewayService, vhost: str) -> bool:
    """Whether the vhost exists: in the gateway's routing snapshot, else as RabbitMQ says.

    Raises:
        _ManagementSilent: RabbitMQ did not answer in time, or its answer was an error.
    """
    if service.gateway.routing.has_vhost(vhost):
        return True
    item = await _look_up(
        service.management.get(f"/api/vhosts/{quote(vhost, safe='')}"), f"vhost {vhost!r}"
    )
    return item is not None


async def list_queues(request: web.Request) -> web.Response:
    """GET /api/queues"""
    return web.json_response([s.to_json() for s in _service(request).gateway.snapshots()])


async def get_queue(request: web.Request) -> web.Response:
    """GET /api/queues/{vhost}/{name}"""
    service = _service(request)
    vhost, name = _names(request)
    try:
        if not await _known(service, vhost, name):
            return _error(404, f"queue {name!r} in vhost {vhost!r} not found")
    except _ManagementSilent as exc:
        return _error(503, str(exc))
    return web.json_response(service.gateway.snapshot(vhost, name).to_json())


async def put_flow(request: web.Request) -> web.Response:
    """PUT /api/queues/{vhost}/{name}/flow"""
    service = _service(request)
    vhost, name = _names(request)
    try:
        body: Any = _parse_json(await request.read())
    except ValueError as exc:
        return _error(400, str(exc))
    if not isinstance(body, dict) or not body:
        return _error(400, "body must be a JSON object with at least one threshold")
    try:
        if not await _known(service, vhost, name):
            return _error(404, f"queue {name!r} in vhost {vhost!r} not found")
    except _ManagementSilent as exc:
        return _error(503, str(exc))
    try:
        thresholds = service.gateway.set_runtime_thresholds(vhost, name, body)
    except ThresholdError as exc:
        return _error(400, str(exc))
    _audit.info(
        "thresholds set",
        user=_who(request),
        peer=request.remote,
        action="set-flow",
        vhost=vhost,
        queue=name,
        **thresholds.to_json(),
    )
    snapshot = service.gateway.snapshot(vhost, name).to_json()
    # Stored as kept, not as in force: an unset resume stays 0, derived again
    # from the stop value after a restart or a later change of the stop alone.
    kept = service.gateway.runtime_thresholds(vhost, name)
    warning = await _persist(service, service.store.save((vhost, name), kept))
    if warning is not None:
        # Applied but not durable: say so rather than pretend.
        snapshot["warning"] = warning
    return web.json_response(snapshot)


async def _persist(service: GatewayService, saving: Awaitable[None]) -> str | None:
    """Wait a bounded time for a store write; a warning when it is not (yet) durable.

    A store slower than :data:`ADMIN_MANAGEMENT_TIMEOUT_S` keeps writing in
    the background; the answer does not wait for it.
    """
    task = asyncio.ensure_future(saving)
    service.keep_running(task)
    try:
        await asyncio.wait_for(asyncio.shield(task), ADMIN_MANAGEMENT_TIMEOUT_S)
    except TimeoutError:
        return (
            "not yet persisted: the store did not answer within "
            f"{ADMIN_MANAGEMENT_TIMEOUT_S:g} s (still trying)"
        )
    except PersistenceError as exc:
        return f"not persisted: {exc}"
    return None


async def list_channels(request: web.Request) -> web.Response:
    """GET /api/channels"""
    gateway = _service(request).gateway
    channels = [c for conn in gateway.connections for c in conn.describe_channels()]
    channels.sort(key=lambda c: (c["connection"], c["channel"]))
    return web.json_response(channels)


class _BadScope(Exception):
    """The body of a producer call is not a valid scope."""


async def _scope(request: web.Request) -> tuple[str | None, str | None]:
    """The optional ``{"vhost", "queue"}`` body of the producer calls.

    Raises:
        _BadScope: not JSON, not an object, unknown keys, non-strings.
    """
    raw = await request.read()
    if not raw.strip():
        return None, None
    try:
        body: Any = _parse_json(raw)
    except ValueError as exc:
        raise _BadScope(str(exc)) from None
    if not isinstance(body, dict):
        raise _BadScope('body must be a JSON object {"vhost": ..., "queue": ...}')
    unknown = sorted(set(body) - {"vhost", "queue"})
    if unknown:
        raise _BadScope(f"unknown key {unknown[0]!r} (expected vhost, queue)")
    values: list[str | None] = []
    for key in ("vhost", "queue"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise _BadScope(f"{key} must be a non-empty string, got {value!r}")
        values.append(value)
    return values[0], values[1]


async def _producers(request: web.Request, action: str) -> web.Response:
    service = _service(request)
    gateway = service.gateway
    try:
        vhost, queue = await _scope(request)
    except _BadScope as exc:
        # Answered, not raised as aiohttp's HTTPBadRequest: a raised response
        # keeps its traceback, whose frames refer back to it (a cycle per request).
        return _error(400, str(exc))
    if action == "stop" and vhost is not None:
        # Not for a start: it must lift a stop of a vhost deleted since.
        try:
            if not await _vhost_known(service, vhost):
                return _error(404, f"vhost {vhost!r} not found")
        except _ManagementSilent as exc:
            return _error(503, str(exc))
    change = gateway.stop_producers if action == "stop" else gateway.start_producers
    try:
        change(vhost=vhost, queue=queue)
    except ValueError as exc:
        return _error(400, str(exc))
    _audit.info(
        f"producers {action}ped" if action == "stop" else "producers started",
        user=_who(request),
        peer=request.remote,
        action=f"{action}-producers",
        vhost=vhost,
        queue=queue,
    )
    answer: dict[str, Any] = {
        "action": action,
        "vhost": vhost,
        "queue": queue,
        "stops": gateway.admin_stops(),
    }
    warning = await _persist(service, service.store.save_stop((vhost, queue), action == "stop"))
    if warning is not None:
        answer["warning"] = warning
    return web.json_response(answer)


async def stop_producers(request: web.Request) -> web.Response:
    """POST /api/producers/stop"""
    return await _producers(request, "stop")


async def start_producers(request: web.Request) -> web.Response:
    """POST /api/producers/start"""
    return await _producers(request, "start")


async def get_store(request: web.Request) -> web.Response:
    """GET /api/store"""
    gateway = _service(request).gateway
    return web.json_response(
        {
            "vhosts": [s.to_json() for s in gateway.store_quotas.snapshots()],
            "stops": gateway.admin_stops(),
            "heldConfirms": gateway.held_confirms(),
        }
    )


async def get_ready(request: web.Request) -> web.Response:
    """GET /api/ready: 200 once the gateway serves clients, else 503 with the reason."""
    reason = _service(request).gateway.ready_error
    if reason is None:
        return web.json_response({"ready": True})
    return web.json_response({"ready": False, "reason": reason}, status=503)


def _resident_bytes() -> int | None:
    """VmRSS of this process (None where ``/proc`` does not say)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _open_fds() -> int | None:
    """File descriptors this process has open (None where ``/proc`` does not say)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return None


async def get_cluster(request: web.Request) -> web.Response:
    """GET /api/cluster: the cluster as this member sees it (404 when standalone)."""
    node = _service(request).cluster
    if node is None:
        return web.json_response(
            {"error": "this gateway is not a cluster member (start it with --cluster NAME)"},
            status=404,
        )
    return web.json_response(node.view())


async def get_runtime(request: web.Request) -> web.Response:
    """GET /api/runtime: memory, descriptors, tasks, connections and the collector."""
    service = _service(request)
    return web.json_response(
        {
            "rssBytes": _resident_bytes(),
            "openFds": _open_fds(),
            "tasks": len(asyncio.all_tasks()),
            "connections": len(service.gateway.connections),
            "gc": service.collector.stats(),
        }
    )


async def get_metrics(request: web.Request) -> web.Response:
    """GET /metrics"""
    body, content_type = negotiate(request.app[_REGISTRY_KEY], request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def console(request: web.Request) -> web.FileResponse:
    """GET / (the web console)"""
    return web.FileResponse(_STATIC / "console.html")


async def _close_authenticator(app: web.Application) -> None:
    authenticator = app[_AUTH_KEY]
    if authenticator is not None:
        await authenticator.close()


def create_app(
    service: GatewayService, *, authenticator: Authenticator | None = None
) -> web.Application:
    """The admin application for one running gateway.

    ``authenticator`` defaults to what the configuration asks for
    (:func:`authenticator_for`).

    """
    if authenticator is None:
        authenticator = authenticator_for(service.config)
    app = web.Application(middlewares=[_guard_middleware, _auth_middleware])
    app[SERVICE_KEY] = service
    app[_AUTH_KEY] = authenticator
    app[_THROTTLE_KEY] = LoginThrottle()
    admin_host, _port = service.config.admin_address
    app[_HOSTS_KEY] = frozenset(
        {
            "localhost",
            "127.0.0.1",
            "::1",
            admin_host.lower(),
            *service.config.admin_allowed_host_names,
        }
    )
    app[_REGISTRY_KEY] = metrics_registry(service.gateway)
    app.on_cleanup.append(_close_authenticator)
    app.router.add_get("/api/queues", list_queues)
    app.router.add_get("/api/queues/{vhost}/{name}", get_queue)
    app.router.add_put("/api/queues/{vhost}/{name}/flow", put_flow)
    app.router.add_get("/api/channels", list_channels)
    app.router.add_get("/api/store", get_store)
    app.router.add_post("/api/producers/stop", stop_producers)
    app.router.add_post("/api/producers/start", start_producers)
    app.router.add_get("/api/ready", get_ready)
    app.router.add_get("/api/runtime", get_runtime)
    app.router.add_get("/api/cluster", get_cluster)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/", console)
    app.router.add_static("/static/", _STATIC, follow_symlinks=False)
    return app
