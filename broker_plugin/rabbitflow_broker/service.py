"""The running gateway: AMQP listener, admin API and background loops.

:class:`GatewayService` wires a :class:`~rabbitflow_broker.gateway.Gateway`
to the world: it accepts AMQP clients (one :class:`~rabbitflow_broker.relay.Relay`
each), serves the admin API, keeps the routing mirror fresh from the
management API and reconciles queue depths with RabbitMQ's counts.

:class:`EventSink` writes each event as one console line (structlog) and
one JSON line in ``--event-log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import structlog
from aiohttp import web

from rabbitflow_broker.config import GatewayConfig
from rabbitflow_broker.depth_source import DepthSources, queue_type
from rabbitflow_broker.events import Event
from rabbitflow_broker.flow import Thresholds
from rabbitflow_broker.gateway import Gateway
from rabbitflow_broker.persistence import (
    FileThresholdStore,
    PersistenceError,
    RabbitMQThresholdStore,
    ThresholdStore,
)
from rabbitflow_broker.relay import Relay
from rabbitflow_broker.routing import RoutingError, RoutingTable
from rabbitflow_broker.store import StoreSource
from rabbitflow_broker.upstream import ManagementClient, ManagementError

__all__ = ["EventSink", "GatewayService", "disk_store_sizes"]

_log = structlog.get_logger("rabbitflow.broker")
_events_log = structlog.get_logger("rabbitflow.broker.events")


class EventSink:
    """Console line + JSON event log for every event; callable."""

    def __init__(self, event_log: str | None) -> None:
        self._path = event_log
        self._file: IO[str] | None = None

    def __call__(self, event: Event) -> None:
        record = event.to_record()
        _events_log.info(event.line(), code=event.code)
        if self._path is not None:
            if self._file is None:
                self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the event log."""
        if self._file is not None:
            self._file.close()
            self._file = None


def disk_store_sizes(data_dir: str) -> dict[str, int]:
    """vhost -> bytes on disk of its message store under a RabbitMQ data dir.

    RabbitMQ keeps each vhost's store in ``msg_stores/vhosts/<hash>/`` with
    the vhost's name in a ``.vhost`` file there; ``data_dir`` may be the
    node's data directory (``.../mnesia/rabbit@host``) or any directory
    above it.  Files that vanish while being measured (segment compaction)
    are skipped.

    Raises:
        OSError: ``data_dir`` cannot be read.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"--store-path: {data_dir} is not a directory")
    sizes: dict[str, int] = {}
    for marker in root.glob("**/msg_stores/vhosts/*/.vhost"):
        try:
            vhost = marker.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        total = 0
        for dirpath, _dirs, files in os.walk(marker.parent):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(dirpath, name)).st_size
        sizes[vhost] = sizes.get(vhost, 0) + total
    return sizes


def _policy(item: Mapping[str, Any]) -> Mapping[str, object]:
    policy = item.get("effective_policy_definition")
    return policy if isinstance(policy, Mapping) else {}


def _arguments(item: Mapping[str, Any]) -> Mapping[str, object]:
    arguments = item.get("arguments")
    return arguments if isinstance(arguments, Mapping) else {}


class GatewayService:
    """Start with ``await start()``, stop with ``await stop()``."""

    def __init__(self, config: GatewayConfig, *, sink: EventSink | None = None) -> None:
        self.config = config
        self.sink = sink if sink is not None else EventSink(config.event_log)
        self._owns_sink = sink is None
        self.gateway = Gateway(config, sink=self.sink)
        user, password = config.management_credentials
        self.management = ManagementClient(config.management_base, user, password)
        self.store: ThresholdStore = (
            FileThresholdStore(config.state_file)
            if config.state_file
            else RabbitMQThresholdStore(self.management)
        )
        self.gateway.runtime_forgotten = self._forget_runtime
        self._server: asyncio.Server | None = None
        self._admin: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._relays: set[Relay] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.depth_sources = DepthSources(interval=config.reconcile_interval / 1000)
        self.port = 0
        self.admin_port = 0

    async def start(self) -> None:
        """Load state, snapshot RabbitMQ, start listening.

        Raises:
            OSError: a listen address cannot be bound.
        """
        stored: dict[tuple[str, str], Thresholds] = {}
        try:
            stored = dict(await self.store.load())
            self.gateway.load_runtime_thresholds(stored)
        except PersistenceError as exc:
            _log.warning("runtime thresholds not loaded", error=str(exc))
        if await self.refresh_routing():
            # Thresholds are set only on existing queues and forgotten when
            # the gateway sees one deleted; a queue deleted while no gateway
            # ran leaves them behind: forget them now.
            for key in stored:
                if not self.gateway.routing.has_queue(*key):
                    _log.info(
                        "forgetting thresholds of a deleted queue", vhost=key[0], queue=key[1]
                    )
                    self.gateway.queue_deleted(*key)
        await self.reconcile_once(initial=True)
        await self.measure_store()
        host, port = self.config.listen_address
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_relay, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        from rabbitflow_broker.admin import create_app

        self._admin = web.AppRunner(create_app(self), access_log=None)
        await self._admin.setup()
        admin_host, admin_port = self.config.admin_address
        site = web.TCPSite(self._admin, admin_host, admin_port)
        await site.start()
        addresses = self._admin.addresses
        self.admin_port = int(addresses[0][1]) if addresses else admin_port
        self._tasks = [
            asyncio.create_task(self._routing_loop(), name="routing-refresh"),
            asyncio.create_task(self._reconcile_loop(), name="reconcile"),
            asyncio.create_task(self._store_loop(), name="store-quota"),
        ]
        _log.info(
            "gateway listening",
            listen=f"{host}:{self.port}",
            upstream="{}:{}".format(*self.config.upstream_address),
            admin=f"{admin_host}:{self.admin_port}",
        )

    async def stop(self) -> None:
        """Close the listener, every relayed connection and the admin API."""
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        relays = list(self._relays)
        for relay in relays:
            relay.abort()
        if relays:
            waiters = [asyncio.create_task(r.wait_closed()) for r in relays]
            _done, pending = await asyncio.wait(waiters, timeout=5)
            for waiter in pending:
                waiter.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        if self._admin is not None:
            await self._admin.cleanup()
        await self.management.close()
        if self._owns_sink:
            self.sink.close()

    def _forget_runtime(self, key: tuple[str, str]) -> None:
        async def forget() -> None:
            try:
                await self.store.save(key, None)
            except PersistenceError as exc:
                _log.warning("stored thresholds not removed", queue=key[1], error=str(exc))

        task = asyncio.get_running_loop().create_task(forget())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _new_relay(self) -> Relay:
        relay = Relay(self.gateway, on_closed=self._relays.discard)
        self._relays.add(relay)
        return relay

    # -- management-API loops --------------------------------------------------

    async def refresh_routing(self) -> bool:
        """Swap in a fresh routing snapshot unless relayed changes raced it.

        Returns whether RabbitMQ answered (False: the last snapshot stays).
        """
        version = self.gateway.routing_version
        try:
            exchanges, queues, bindings, policies = await self.management.routing_items()
            table = RoutingTable.from_management(exchanges, queues, bindings, policies)
        except (ManagementError, RoutingError) as exc:
            _log.warning("routing snapshot failed", error=str(exc))
            return False
        if self.gateway.routing_version == version:
            self.gateway.routing.replace(table)
        for item in queues:
            self.gateway.queue_seen(
                str(item["vhost"]), str(item["name"]), _arguments(item), _policy(item)
            )
        return True

    async def reconcile_once(self, *, initial: bool = False) -> None:
        """Adopt RabbitMQ's depth for queues the gateway left alone meanwhile.

        Which of RabbitMQ's counts is true for which queue type is decided
        by :class:`~rabbitflow_broker.depth_source.DepthSources`: the
        current totals for classic queues, the statistics (after a longer
        quiet time) for quorum queues and streams, never a 0 or null that
        the totals listing gives for those.
        """
        gateway = self.gateway
        versions = {key: gateway.depth.version(key) for key in gateway.queue_keys()}
        try:
            totals = await self.management.queue_totals()
            stats = await self.management.queue_bytes()
        except ManagementError as exc:
            _log.warning("depth reconciliation failed", error=str(exc))
            return
        seen: set[tuple[str, str]] = set()
        for item in totals:
            key = (str(item["vhost"]), str(item["name"]))
            seen.add(key)
            if not gateway.knows_queue(*key):
                gateway.queue_seen(key[0], key[1], _arguments(item), _policy(item))
                if not gateway.routing.has_queue(*key):
                    gateway.routing.declare_queue(key[0], key[1], _arguments(item))
            seen_version = versions.get(key, gateway.depth.version(key))
            readings = self.depth_sources.readings(
                key,
                queue_type(_arguments(item), item.get("type")),
                totals=item.get("messages"),
                stats=stats.get(key),
                seen_version=seen_version,
                initial=initial,
            )
            for reading in readings:
                gateway.reconcile(
                    key[0],
                    key[1],
                    messages=reading.messages,
                    size=reading.size,
                    seen_version=seen_version,
                    settle=reading.settle,
                )
        self.depth_sources.keep_only(seen)
        for key, version in versions.items():
            if key not in seen and gateway.depth.version(key) == version:
                gateway.queue_deleted(*key)
                with contextlib.suppress(RoutingError):
                    gateway.routing.delete_queue(*key)

    async def measure_store(self) -> None:
        """Feed every vhost's store size to the quota machines.

        From the on-disk message store with ``--store-path``, else from
        RabbitMQ's ``message_bytes_persistent`` statistics.  A failed
        measurement changes nothing (the last state holds).
        """
        path = self.config.store_path
        try:
            if path:
                sizes = await asyncio.to_thread(disk_store_sizes, path)
                source: StoreSource = "disk"
            else:
                sizes = await self.management.store_sizes()
                source = "management"
        except (ManagementError, OSError) as exc:
            _log.warning("store size not measured", error=str(exc))
            return
        for vhost, size in sizes.items():
            self.gateway.observe_store(vhost, size, source)

    async def _store_loop(self) -> None:
        interval = self.config.store_poll_interval / 1000
        if not interval:
            return
        if not self.config.store_overfull_size:
            # Quota off: sizes are only shown by the admin API; poll gently.
            interval = max(interval, 10.0)
        while True:
            await asyncio.sleep(interval)
            await self.measure_store()

    async def _routing_loop(self) -> None:
        interval = self.config.routing_refresh_interval / 1000
        if not interval:
            return
        while True:
            await asyncio.sleep(interval)
            await self.refresh_routing()

    async def _reconcile_loop(self) -> None:
        interval = self.config.reconcile_interval / 1000
        if not interval:
            return
        while True:
            await asyncio.sleep(interval)
            await self.reconcile_once()
