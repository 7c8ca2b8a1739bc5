"""How ``rabbitflow-config`` reaches the gateway (:mod:`rabbitflow_broker.cli.config_cli`).

Two ways in, one error: :class:`AdminClient` speaks the admin API over
HTTP (the read commands, ``set-flow``, ``stop-producers``,
``start-producers``); :func:`declare_queue` and :func:`delete_queue` speak
AMQP *through the gateway* (``add-queue``, ``delete-queue``), so it
validates the ``qpid.flow_*`` arguments as for any client's declare.
Every failure of either is a :class:`CliError` that carries its one-line
message and the exit status.  Only the standard library is imported here;
pika only when an AMQP command runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "PASSWORD_ENV",
    "AdminClient",
    "CliError",
    "declare_queue",
    "delete_queue",
]

EXIT_ERROR = 1
EXIT_USAGE = 2

PASSWORD_ENV = "RABBITFLOW_ADMIN_PASSWORD"


class CliError(Exception):
    """A failure reported as one line on stderr with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, kw_only=True)
class AdminClient:
    """A small synchronous client of the gateway's admin API.

    Every method raises :class:`CliError` with a one-line message for an
    unreachable gateway, a refused request or an unexpected answer.
    """

    base_url: str
    user: str | None = None
    password: str | None = None
    timeout: float = 10.0

    def request(self, method: str, path: str, body: object | None = None) -> Any:
        """Send one request; return the decoded JSON answer.

        Raises:
            CliError: connection failure (exit 1), 400 (exit 2), 401/403/404
                and other HTTP errors (exit 1), or a non-JSON answer.
        """
        url = self.base_url.rstrip("/") + path
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.user is not None:
            token = f"{self.user}:{self.password or ''}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(method, path, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                f"cannot reach the gateway admin API at {self.base_url}: {reason}"
            ) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise CliError(f"{method} {path}: the answer is not JSON") from None

    def queues(self) -> list[dict[str, Any]]:
        """``GET /api/queues``."""
        answer = self.request("GET", "/api/queues")
        if not isinstance(answer, list):
            raise CliError("GET /api/queues: expected a JSON list")
        return answer

    def queue(self, vhost: str, name: str) -> dict[str, Any]:
        """``GET /api/queues/{vhost}/{name}``."""
        answer = self.request("GET", _queue_path(vhost, name))
        if not isinstance(answer, dict):
            raise CliError(f"GET {_queue_path(vhost, name)}: expected a JSON object")
        return answer

    def set_flow(self, vhost: str, name: str, changes: Mapping[str, int]) -> dict[str, Any]:
        """``PUT /api/queues/{vhost}/{name}/flow``."""
        path = _queue_path(vhost, name) + "/flow"
        answer = self.request("PUT", path, dict(changes))
        if not isinstance(answer, dict):
            raise CliError(f"PUT {path}: expected a JSON object")
        return answer

    def producers(self, action: str, vhost: str | None, queue: str | None) -> Any:
        """``POST /api/producers/{stop|start}`` with the optional vhost and queue."""
        body: dict[str, str] = {}
        if vhost is not None:
            body["vhost"] = vhost
        if queue is not None:
            body["queue"] = queue
        return self.request("POST", f"/api/producers/{action}", body)


def _queue_path(vhost: str, name: str) -> str:
    return f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}"


def _http_error(method: str, path: str, exc: urllib.error.HTTPError) -> CliError:
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    detail = body.get("error") if isinstance(body, dict) else None
    if exc.code == 403 and detail:  # not the credentials: e.g. a Host the API does not serve
        return CliError(f"the gateway admin API refused the request (403): {detail}")
    if exc.code in (401, 403):
        return CliError(
            f"the gateway admin API refused the credentials ({exc.code}); "
            f"give --user and --password (or ${PASSWORD_ENV})"
        )
    if exc.code == 404 and detail is None:
        # aiohttp's own 404 (plain text): the route does not exist on this gateway.
        return CliError(
            f"this gateway does not support {method} {path} (404 Not Found); "
            "it is probably older than this rabbitflow-config"
        )
    if exc.code == 400:
        return CliError(f"refused: {detail or exc.reason}", EXIT_USAGE)
    return CliError(f"{detail or exc.reason} (HTTP {exc.code})")


# -- AMQP through the gateway -------------------------------------------------------


def _connect(gateway_url: str, vhost: str | None) -> tuple[Any, Any]:
    """A pika connection to the gateway and its parameters."""
    # pika is imported here only: the read-only commands need no AMQP library.
    import pika
    import pika.exceptions

    try:
        parameters = pika.URLParameters(gateway_url)
    except Exception as exc:  # pika raises assorted errors for a bad URL
        raise CliError(f"--gateway-url: bad AMQP URL {gateway_url!r}: {exc}", EXIT_USAGE) from None
    if vhost is not None:
        parameters.virtual_host = vhost
    parameters.connection_attempts = 1
    parameters.socket_timeout = 10
    parameters.blocked_connection_timeout = 10
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.ProbableAuthenticationError:
        raise CliError(f"the gateway at {gateway_url} refused the credentials") from None
    except pika.exceptions.ProbableAccessDeniedError:
        raise CliError(
            f"access to vhost {parameters.virtual_host!r} refused at {gateway_url}"
        ) from None
    except pika.exceptions.AMQPError as exc:
        raise CliError(f"cannot reach the gateway at {gateway_url}: {exc!r}") from None
    return connection, parameters


@contextlib.contextmanager
def _channel(gateway_url: str, vhost: str | None, what: str) -> Iterator[tuple[Any, Any]]:
    """A channel on a new connection to the gateway, and the connection's
    parameters; a refusal on it becomes a :class:`CliError` naming ``what``
    (406, a precondition: exit 2), and the connection is closed after."""
    import pika.exceptions

    connection, parameters = _connect(gateway_url, vhost)
    try:
        yield connection.channel(), parameters
    except pika.exceptions.ChannelClosedByBroker as exc:
        code = EXIT_USAGE if exc.reply_code == 406 else EXIT_ERROR
        raise CliError(f"{what} refused ({exc.reply_code}): {exc.reply_text}", code) from None
    except pika.exceptions.AMQPError as exc:
        raise CliError(f"{what} failed: {exc!r}") from None
    finally:
        if connection.is_open:
            connection.close()


def delete_queue(
    gateway_url: str, vhost: str | None, name: str, *, if_unused: bool, if_empty: bool
) -> tuple[str, int]:
    """Delete the queue ``name`` through the gateway.

    Returns the vhost it was in and how many messages went with it.

    Raises:
        CliError: a bad URL or a refused delete (406: exit 2), an unreachable
            gateway, refused credentials or another refusal (exit 1).
    """
    with _channel(gateway_url, vhost, "delete") as (channel, parameters):
        frame = channel.queue_delete(name, if_unused=if_unused, if_empty=if_empty)
    return str(parameters.virtual_host), int(frame.method.message_count)


def declare_queue(
    gateway_url: str,
    vhost: str | None,
    name: str,
    *,
    durable: bool,
    arguments: Mapping[str, object],
) -> str:
    """Declare the queue ``name`` with ``arguments`` through the gateway.

    Returns the vhost it was declared in.

    Raises:
        CliError: a bad URL or arguments the gateway refused (406: exit 2),
            an unreachable gateway, refused credentials or another refusal
            (exit 1).
    """
    with _channel(gateway_url, vhost, "declare") as (channel, parameters):
        channel.queue_declare(name, durable=durable, arguments=dict(arguments) or None)
    return str(parameters.virtual_host)
