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
* ``GET /api/ready``: 200 ``{"ready": true}`` once the gateway has its
  first routing snapshot, else 503 with the reason clients are refused;
* ``GET /metrics`` (Prometheus text, see :mod:`rabbitflow_broker.metrics`);
* ``GET /`` the web console (``static/``).

Errors are JSON ``{"error": "..."}`` with 400 (bad request, refused
threshold, malformed JSON), 401 (credentials), 403 (a request a browser
could have been tricked into sending), 404 (unknown queue) or 429 (too
many failed logins).

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
import binascii
import hashlib
import hmac
import json
import time
from base64 import b64decode
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from rabbitflow_broker.flow import ThresholdError
from rabbitflow_broker.metrics import CONTENT_TYPE, metrics_registry, render
from rabbitflow_broker.persistence import PersistenceError
from rabbitflow_broker.upstream import ManagementError

if TYPE_CHECKING:
    from rabbitflow_broker.config import GatewayConfig
    from rabbitflow_broker.service import GatewayService

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

_log = structlog.get_logger("rabbitflow.broker.admin")
_audit = structlog.get_logger("rabbitflow.broker.audit")

SERVICE_KEY: web.AppKey[GatewayService] = web.AppKey("service")
_AUTH_KEY: web.AppKey[Authenticator | None] = web.AppKey("authenticator")
_REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics")
_USER_KEY: web.RequestKey[str] = web.RequestKey("user")
_THROTTLE_KEY: web.AppKey[LoginThrottle] = web.AppKey("login-throttle")
_HOSTS_KEY: web.AppKey[frozenset[str]] = web.AppKey("allowed-hosts")

#: Who a mutating call is attributed to when no authentication is configured.
ANONYMOUS = "anonymous (loopback)"
#: Seconds a RabbitMQ answer about a user's credentials is reused.
RABBITMQ_AUTH_TTL = 5.0
#: Failed logins one address may make within :data:`LOGIN_WINDOW_S` before 429.
LOGIN_FAILURES_ALLOWED = 10
#: Seconds a failed login counts against its address.
LOGIN_WINDOW_S = 60.0

#: Seconds an admin request waits for RabbitMQ's management API before answering anyway.
ADMIN_MANAGEMENT_TIMEOUT_S = 2.0

_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_STATIC = Path(__file__).with_name("static")
_REALM = 'Basic realm="rabbitflow-broker", charset="UTF-8"'


# -- authentication ---------------------------------------------------------------


class Authenticator(Protocol):
    """Checks one user/password pair."""

    async def check(self, user: str, password: str) -> bool:
        """True when the credentials are good."""

    async def close(self) -> None:
        """Release resources (HTTP sessions)."""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


class StaticUsers:
    """Users from the configuration; passwords compared in constant time."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {user: _digest(password) for user, password in users.items()}
        self._nobody = _digest("\0rabbitflow: no such user\0")

    async def check(self, user: str, password: str) -> bool:
        """True when ``user`` is configured with this ``password``."""
        # Compare even for unknown users so timing does not reveal names.
        expected = self._users.get(user, self._nobody)
        good = hmac.compare_digest(expected, _digest(password))
        return good and user in self._users

    async def close(self) -> None:
        """Nothing to release."""


class RabbitMQUsers:
    """Checks credentials against RabbitMQ's users (management ``GET /api/whoami``).

    Answers (good and bad) are cached for ``ttl`` seconds, keyed by user and
    a hash of the password, so a console polling every second does not
    hit RabbitMQ each time.  An unreachable management API refuses.
    """

    def __init__(
        self,
        management_base: str,
        *,
        ttl: float = RABBITMQ_AUTH_TTL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = management_base.rstrip("/") + "/api/whoami"
        self._ttl = ttl
        self._monotonic = monotonic
        self._cache: dict[tuple[str, bytes], tuple[bool, float]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def check(self, user: str, password: str) -> bool:
        """True when RabbitMQ accepts these credentials for its management API."""
        key = (user, _digest(password))
        now = self._monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        try:
            headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
            async with self._session.get(self._url, headers=headers) as response:
                good = response.status == 200
        except (TimeoutError, aiohttp.ClientError) as exc:
            _log.warning("admin credentials not checked: management API failed", error=str(exc))
            return False
        for stale in [k for k, (_, expires) in self._cache.items() if expires <= now]:
            del self._cache[stale]
        self._cache[key] = (good, now + self._ttl)
        return good

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class LoginThrottle:
    """Counts failed logins per address in a sliding window (pure; clock passed in).

    ``allowed(peer, now)`` is False once ``limit`` failures of ``peer`` fall
    within the last ``window`` seconds; it becomes True again as they age
    out.  A good login does not reset the count: an attacker holding one
    valid account must not earn more guesses at the others.
    """

    def __init__(
        self, *, limit: int = LOGIN_FAILURES_ALLOWED, window: float = LOGIN_WINDOW_S
    ) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, list[float]] = {}

    def _recent(self, peer: str, now: float) -> list[float]:
        times = [t for t in self._failures.get(peer, ()) if t > now - self.window]
        if times:
            self._failures[peer] = times
        else:
            self._failures.pop(peer, None)
        return times

    def allowed(self, peer: str, now: float) -> bool:
        """Whether ``peer`` may try to log in at ``now``."""
        return len(self._recent(peer, now)) < self.limit

    def retry_after(self, peer: str, now: float) -> float:
        """Seconds until ``peer`` may try again (0 when it may now)."""
        times = self._recent(peer, now)
        if len(times) < self.limit:
            return 0.0
        return times[-self.limit] + self.window - now

    def failed(self, peer: str, now: float) -> None:
        """Record one failed login of ``peer``."""
        self._failures[peer] = [*self._recent(peer, now), now]
        # Forget idle addresses so a scan of many sources cannot grow the table forever.
        if len(self._failures) > 10_000:
            for stale in [p for p in self._failures if not self._recent(p, now)]:
                del self._failures[stale]


def authenticator_for(config: GatewayConfig) -> Authenticator | None:
    """The authenticator ``--admin-auth`` asks for; ``None`` for ``none``.

    The configuration has already validated the mode and the users (and
    refused ``none`` on a non-loopback ``--admin-listen``).
    """
    if config.admin_auth == "users":
        return StaticUsers(config.admin_credentials)
    if config.admin_auth == "rabbitmq":
        return RabbitMQUsers(config.management_base)
    return None


def _credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        decoded = b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def _unauthorized(text: str) -> web.Response:
    return web.json_response({"error": text}, status=401, headers={"WWW-Authenticate": _REALM})


def _forbidden(text: str) -> web.Response:
    return web.json_response({"error": text}, status=403)


def _host_name(authority: str) -> str:
    """The host of a ``Host`` header or URL authority, lower-case, without port or brackets."""
    host = authority.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host


def _forgery(request: web.Request) -> str | None:
    """Why this request may have been forged by a web page, or None."""
    allowed = request.app[_HOSTS_KEY]
    host_header = request.headers.get("Host", "")
    host = _host_name(host_header)
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    local = str(sockname[0]).lower() if sockname else None
    if not host or (host not in allowed and host != local):
        return (
            f"Host {host_header!r} is not this admin API (allowed: its listen address, "
            "localhost, or a name given with --admin-allowed-hosts)"
        )
    if request.method not in _MUTATING:
        return None
    if request.content_type != "application/json":
        return f"{request.method} needs Content-Type: application/json"
    origin = request.headers.get("Origin")
    if origin is not None and origin.rstrip("/").lower() not in {
        f"http://{host_header.lower()}",
        f"https://{host_header.lower()}",
    }:
        return f"Origin {origin!r} is not this admin API (http://{host_header})"
    return None


@web.middleware
async def _guard_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    reason = _forgery(request)
    if reason is not None:
        _log.warning(
            "admin request refused",
            method=request.method,
            path=request.path,
            peer=request.remote,
            reason=reason,
        )
        return _forbidden(reason)
    return await handler(request)


@web.middleware
async def _auth_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    authenticator = request.app[_AUTH_KEY]
    if authenticator is None:
        request[_USER_KEY] = ANONYMOUS
        return await handler(request)
    throttle = request.app[_THROTTLE_KEY]
    peer = request.remote or "?"
    now = time.monotonic()
    if not throttle.allowed(peer, now):
        wait = max(1, round(throttle.retry_after(peer, now)))
        return web.json_response(
            {"error": f"too many failed logins from {peer}; try again in {wait} s"},
            status=429,
            headers={"Retry-After": str(wait)},
        )
    credentials = _credentials(request)
    if credentials is None:
        return _unauthorized("credentials required (HTTP basic)")
    if not await authenticator.check(*credentials):
        throttle.failed(peer, now)
        _log.warning("admin credentials refused", user=credentials[0], peer=request.remote)
        return _unauthorized("wrong user or password")
    request[_USER_KEY] = credentials[0]
    return await handler(request)


def _who(request: web.Request) -> str:
    return str(request.get(_USER_KEY, ANONYMOUS))


# -- handlers -----------------------------------------------------------------------


def _error(status: int, text: str) -> web.Response:
    return web.json_response({"error": text}, status=status)


def _service(request: web.Request) -> GatewayService:
    return request.app[SERVICE_KEY]


#: Deepest nesting of arrays/objects accepted in a request body (ours are flat).
MAX_JSON_DEPTH = 32


def _json_depth(raw: str) -> int:
    """Deepest bracket nesting outside strings, in one linear pass."""
    depth = deepest = 0
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parse_json(raw: bytes) -> Any:
    """A request body as JSON.

    Raises:
        ValueError: with a message for the client: not UTF-8, not JSON,
            nested deeper than :data:`MAX_JSON_DEPTH`, or an integer with
            more digits than Python converts (4,300).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("body is not UTF-8") from None
    if _json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        # int() refuses numbers of more than 4,300 digits with a ValueError.
        raise ValueError(f"body is not acceptable JSON: {exc}") from None


def _names(request: web.Request) -> tuple[str, str]:
    # aiohttp leaves %2F encoded inside a path segment; decode it ourselves.
    return unquote(request.match_info["vhost"]), unquote(request.match_info["name"])


class _ManagementSilent(Exception):
    """The management API did not answer within the admin API's patience."""


async def _known(service: GatewayService, vhost: str, name: str) -> bool:
    """Whether the queue exists; asks RabbitMQ about queues the gateway has not seen.

    Raises:
        _ManagementSilent: RabbitMQ did not answer in time.
    """
    gateway = service.gateway
    if gateway.knows_queue(vhost, name):
        return True
    try:
        async with asyncio.timeout(ADMIN_MANAGEMENT_TIMEOUT_S):
            item = await service.management.queue(vhost, name)
    except TimeoutError:
        raise _ManagementSilent(
            f"queue {name!r} in vhost {vhost!r} is not known to the gateway and the "
            f"management API did not answer within {ADMIN_MANAGEMENT_TIMEOUT_S:g} s"
        ) from None
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
    warning = await _persist(service, service.store.save((vhost, name), thresholds))
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


async def _scope(request: web.Request) -> tuple[str | None, str | None]:
    """The optional ``{"vhost", "queue"}`` body of the producer calls.

    Raises:
        web.HTTPBadRequest: not JSON, not an object, unknown keys, non-strings.
    """
    raw = await request.read()
    if not raw.strip():
        return None, None
    try:
        body: Any = _parse_json(raw)
    except ValueError as exc:
        raise _bad_request(str(exc)) from None
    if not isinstance(body, dict):
        raise _bad_request('body must be a JSON object {"vhost": ..., "queue": ...}')
    unknown = sorted(set(body) - {"vhost", "queue"})
    if unknown:
        raise _bad_request(f"unknown key {unknown[0]!r} (expected vhost, queue)")
    values: list[str | None] = []
    for key in ("vhost", "queue"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise _bad_request(f"{key} must be a non-empty string, got {value!r}")
        values.append(value)
    return values[0], values[1]


def _bad_request(text: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": text}), content_type="application/json")


async def _producers(request: web.Request, action: str) -> web.Response:
    gateway = _service(request).gateway
    vhost, queue = await _scope(request)
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
    service = _service(request)
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
            "vhosts": [s.to_json() for s in gateway.store_snapshots()],
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


async def get_metrics(request: web.Request) -> web.Response:
    """GET /metrics"""
    body = render(request.app[_REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


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
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/", console)
    app.router.add_static("/static/", _STATIC, follow_symlinks=False)
    return app
