"""Client of RabbitMQ's management HTTP API (aiohttp).

The gateway asks RabbitMQ for:

* the routing snapshot (``/api/exchanges``, ``/api/queues``,
  ``/api/bindings``, ``/api/policies``) at start and periodically;
* queue totals (``/api/queues?disable_stats=true&enable_queue_totals=true``,
  current to milliseconds: ``messages`` = ready + unacknowledged);
* queue statistics (``messages``, ``message_bytes`` and their ready and
  unacknowledged parts, seconds old);
* per-vhost store sizes (sum of ``message_bytes_persistent`` over the
  vhost's queues; statistics, up to ``collect_statistics_interval`` (5 s)
  old) for the store quota;
* global runtime parameters, where runtime thresholds are kept.

Raises :class:`ManagementError` for HTTP errors and unreachable servers.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote

import aiohttp

from rabbitflow_broker.engine.errors import OutsideError

__all__ = [
    "ManagementClient",
    "ManagementError",
    "QueueStatistics",
    "item_arguments",
    "item_policy",
]

_Items = list[Mapping[str, Any]]
_TIMEOUT = aiohttp.ClientTimeout(total=10)


def item_policy(item: Mapping[str, Any]) -> Mapping[str, object]:
    """A listed queue's effective policy definition ({} when none)."""
    policy = item.get("effective_policy_definition")
    return policy if isinstance(policy, Mapping) else {}


def item_arguments(item: Mapping[str, Any]) -> Mapping[str, object]:
    """A listed queue's declare arguments ({} when none)."""
    arguments = item.get("arguments")
    return arguments if isinstance(arguments, Mapping) else {}


class QueueStatistics(NamedTuple):
    """A queue's counts from the statistics (``ready`` and ``unacked`` as listed,
    unchecked)."""

    messages: int
    size: int
    ready: object
    unacked: object


class ManagementError(OutsideError):
    """The management API failed or answered with an error status."""


class _Unreachable(ManagementError):
    """A node's management API could not be reached (another may answer)."""


def _q(value: str) -> str:
    return quote(value, safe="")


class ManagementClient:
    """Async management-API client; ``await close()`` when done."""

    def __init__(
        self, base_url: str, user: str, password: str, *, more: Sequence[str] = ()
    ) -> None:
        #: Every node's API (``more``: the other nodes of a RabbitMQ cluster);
        #: a request that cannot reach one tries the next, which then stays.
        self.base_urls = [url.rstrip("/") for url in (base_url, *more)]
        self.base_url = self.base_urls[0]
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self._headers = {"Authorization": f"Basic {token}"}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=_TIMEOUT)
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: object | None = None) -> Any:
        for _ in range(len(self.base_urls) - 1):
            try:
                return await self._request_one(method, path, body)
            except _Unreachable:
                # This node is down: the next one answers from now on.
                self.base_urls.append(self.base_urls.pop(0))
                self.base_url = self.base_urls[0]
        try:
            return await self._request_one(method, path, body)
        except _Unreachable as exc:
            raise ManagementError(str(exc)) from exc.__cause__

    async def _request_one(self, method: str, path: str, body: object | None = None) -> Any:
        url = self.base_url + path
        try:
            async with self._client().request(method, url, json=body) as response:
                if response.status == 404 and method == "GET":
                    return None
                if response.status >= 400:
                    text = await response.text()
                    raise ManagementError(f"{method} {path}: HTTP {response.status} {text[:200]}")
                if response.status == 204 or response.content_length == 0:
                    return None
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _Unreachable(f"{method} {url}: {exc}") from exc

    async def get(self, path: str) -> Any:
        """GET a JSON resource (None for 404).

        Raises:
            ManagementError: transport failure or error status.
        """
        return await self._request("GET", path)

    async def routing_items(
        self,
    ) -> tuple[
        list[Mapping[str, Any]],
        list[Mapping[str, Any]],
        list[Mapping[str, Any]],
        list[Mapping[str, Any]],
    ]:
        """Exchanges, queues, bindings and policies of every vhost.

        Raises:
            ManagementError: transport failure or error status.
        """
        exchanges = await self.get("/api/exchanges?disable_stats=true") or []
        queues = await self.get("/api/queues?disable_stats=true") or []
        bindings = await self.get("/api/bindings") or []
        policies = await self.get("/api/policies") or []
        return exchanges, queues, bindings, policies

    async def queue_totals(self) -> list[Mapping[str, Any]]:
        """Every queue with ``messages`` (ready + unacked), current to milliseconds.

        Raises:
            ManagementError: transport failure or error status.
        """
        items = await self.get("/api/queues?disable_stats=true&enable_queue_totals=true")
        return list(items or [])

    async def queue_statistics(self) -> dict[tuple[str, str], QueueStatistics]:
        """(vhost, name) -> the queue's counts from the statistics.

        Statistics: up to ``collect_statistics_interval`` (5 s by default) old.

        Raises:
            ManagementError: transport failure or error status.
        """
        items = (
            await self.get(
                "/api/queues?columns=vhost,name,messages,message_bytes,"
                "messages_ready,messages_unacknowledged"
            )
            or []
        )
        out: dict[tuple[str, str], QueueStatistics] = {}
        for item in items:
            messages, size = item.get("messages"), item.get("message_bytes")
            if isinstance(messages, int) and isinstance(size, int):
                out[(str(item["vhost"]), str(item["name"]))] = QueueStatistics(
                    messages, size, item.get("messages_ready"), item.get("messages_unacknowledged")
                )
        return out

    async def store_sizes(self) -> dict[str, int]:
        """vhost -> bytes of its persistent messages (0 for a vhost without queues).

        Statistics: up to ``collect_statistics_interval`` (5 s by default) old.

        Raises:
            ManagementError: transport failure or error status.
        """
        vhosts = await self.get("/api/vhosts?columns=name") or []
        sizes = {str(item["name"]): 0 for item in vhosts if "name" in item}
        items = await self.get("/api/queues?columns=vhost,message_bytes_persistent") or []
        for item in items:
            size = item.get("message_bytes_persistent")
            if isinstance(size, int) and not isinstance(size, bool):
                vhost = str(item["vhost"])
                sizes[vhost] = sizes.get(vhost, 0) + size
        return sizes

    async def queue(self, vhost: str, name: str) -> Mapping[str, Any] | None:
        """One queue, or None when it does not exist.

        Raises:
            ManagementError: transport failure or error status.
        """
        item = await self.get(f"/api/queues/{_q(vhost)}/{_q(name)}?disable_stats=true")
        return item if isinstance(item, Mapping) else None

    async def global_parameters(self, prefix: str) -> list[Mapping[str, Any]]:
        """Global runtime parameters whose name starts with ``prefix``.

        Raises:
            ManagementError: transport failure or error status.
        """
        items = await self.get("/api/global-parameters") or []
        return [i for i in items if str(i.get("name", "")).startswith(prefix)]

    async def put_global_parameter(self, name: str, value: object) -> None:
        """Create or replace a global runtime parameter.

        Raises:
            ManagementError: transport failure or error status.
        """
        await self._request(
            "PUT", f"/api/global-parameters/{_q(name)}", {"name": name, "value": value}
        )

    async def delete_global_parameter(self, name: str) -> None:
        """Delete a global runtime parameter (absent is fine).

        Raises:
            ManagementError: transport failure or error status.
        """
        try:
            await self._request("DELETE", f"/api/global-parameters/{_q(name)}")
        except ManagementError as exc:
            if "HTTP 404" not in str(exc):
                raise


def queue_items_by_key(
    items: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Index management queue items by (vhost, name)."""
    return {(str(i["vhost"]), str(i["name"])): i for i in items}
