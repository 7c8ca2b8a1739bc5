"""Request guards and authentication of the admin API (:mod:`rabbitflow_broker.admin.api`).

The checks that run before any handler: the middleware that refuses what a
web page could have made a browser send (``Host``, ``Content-Type``,
``Origin``), the authenticators behind ``--admin-auth`` with the per-address
login throttle, and the parser that bounds a request body's JSON.  What
they enforce is described in :mod:`rabbitflow_broker.admin.api`, which
re-exports the public names.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import time
from base64 import b64decode
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import structlog
from aiohttp import web

if TYPE_CHECKING:
    from rabbitflow_broker.hub.config import GatewayConfig

__all__ = [
    "ANONYMOUS",
    "LOGIN_FAILURES_ALLOWED",
    "LOGIN_WINDOW_S",
    "MAX_JSON_DEPTH",
    "RABBITMQ_AUTH_TTL",
    "Authenticator",
    "LoginThrottle",
    "RabbitMQUsers",
    "StaticUsers",
    "authenticator_for",
]

_log = structlog.get_logger("rabbitflow.broker.admin")

_AUTH_KEY: web.AppKey[Authenticator | None] = web.AppKey("authenticator")
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

_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
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
        self._checking: dict[str, int] = {}  # logins of each address being checked now

    def _recent(self, peer: str, now: float) -> list[float]:
        times = [t for t in self._failures.get(peer, ()) if t > now - self.window]
        if times:
            self._failures[peer] = times
        else:
            self._failures.pop(peer, None)
        return times

    def allowed(self, peer: str, now: float) -> bool:
        """Whether ``peer`` may try to log in at ``now``: its recent failures and
        the logins of its being checked (each may fail) are under the limit, so
        parallel guesses get no more than one after the other."""
        return len(self._recent(peer, now)) + self._checking.get(peer, 0) < self.limit

    def begin(self, peer: str) -> None:
        """A login of ``peer`` is being checked (end it with :meth:`end`)."""
        self._checking[peer] = self._checking.get(peer, 0) + 1

    def end(self, peer: str) -> None:
        """The check :meth:`begin` announced is over (record a failure apart)."""
        left = self._checking.pop(peer, 1) - 1
        if left:
            self._checking[peer] = left

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
    throttle.begin(peer)
    try:
        good = await authenticator.check(*credentials)
    finally:
        throttle.end(peer)
    if not good:
        throttle.failed(peer, now)
        _log.warning("admin credentials refused", user=credentials[0], peer=request.remote)
        return _unauthorized("wrong user or password")
    request[_USER_KEY] = credentials[0]
    return await handler(request)


def _who(request: web.Request) -> str:
    return str(request.get(_USER_KEY, ANONYMOUS))


# -- request bodies ---------------------------------------------------------------


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
