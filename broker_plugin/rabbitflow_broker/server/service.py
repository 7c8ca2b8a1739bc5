"""The running gateway: AMQP listeners, admin API and background loops.

:class:`GatewayService` wires a :class:`~rabbitflow_broker.hub.gateway.Gateway`
to the world: it accepts AMQP clients (one :class:`~rabbitflow_broker.server.relay.Relay`
each, plain and/or TLS), serves the admin API, keeps the routing mirror
fresh from the management API and reconciles queue depths with RabbitMQ's
counts.

Start-up never waits on the management API: the listeners open at once and
``gateway.ready_error`` names what is missing (clients get 320 with it)
until the first routing snapshot is in, fetched in the background.  An
outage of RabbitMQ is logged as one ``upstream lost`` line, a reminder at
most every :data:`OUTAGE_REMINDER_S` seconds and one ``upstream back`` line
(:class:`OutageLog`).

:class:`EventSink` writes each event as one console line (structlog) and
one JSON line in ``--event-log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
import tenacity
from aiohttp import web

from rabbitflow_broker import accel
from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.engine.routing import RoutingError, RoutingTable
from rabbitflow_broker.engine.store import StoreSource
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.depth_sources import DepthSources, queue_type
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.cluster_node import ClusterNode
from rabbitflow_broker.server.depth_poller import DepthPoll, PassiveDeclarer
from rabbitflow_broker.server.gc_policy import CollectorPolicy
from rabbitflow_broker.server.management import (
    ManagementClient,
    ManagementError,
    item_arguments,
    item_policy,
)
from rabbitflow_broker.server.outage import OUTAGE_REMINDER_S, OutageLog
from rabbitflow_broker.server.persistence import (
    FileThresholdStore,
    PersistenceError,
    RabbitMQThresholdStore,
    ThresholdStore,
)
from rabbitflow_broker.server.read_pause import ReadPause
from rabbitflow_broker.server.relay import Relay
from rabbitflow_broker.server.service_io import (
    DescriptorWatch,
    EventSink,
    disk_store_sizes,
    listener_lost,
    loop_exception_handler,
    server_ssl_context,
    upstream_ssl_context,
)

__all__ = [
    "OUTAGE_REMINDER_S",
    "EventSink",
    "GatewayService",
    "OutageLog",
    "disk_store_sizes",
    "loop_exception_handler",
    "server_ssl_context",
    "upstream_ssl_context",
]

_log = structlog.get_logger("rabbitflow.broker")

#: Seconds start-up waits for the first routing snapshot before listening anyway.
STARTUP_GRACE_S = 0.5


#: Seconds each step of stopping may take before the next goes on.
_STOP_STEP_S = 5.0


class GatewayService:
    """Start with ``await start()``, stop with ``await stop()``."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        sink: EventSink | None = None,
        admin_app: Callable[[GatewayService], web.Application] | None = None,
    ) -> None:
        """``admin_app``: the admin API (:func:`~rabbitflow_broker.admin.api.create_app`)."""
        self.config = config
        self._admin_app = admin_app
        self.sink = (
            sink
            if sink is not None
            else EventSink(
                config.event_log,
                max_bytes=config.event_log_max_bytes,
                keep=config.event_log_keep,
                max_age_s=config.event_log_max_age,
            )
        )
        self._owns_sink = sink is None
        self.gateway = Gateway(config, sink=self.sink)
        self.read_pause = ReadPause(config.read_pause_us)  # shared by every relay
        # Names fd exhaustion, which uvloop drops silently.
        self.descriptors = DescriptorWatch.of_this_process()
        user, password = config.management_credentials
        bases = config.management_bases
        self.management = ManagementClient(bases[0], user, password, more=bases[1:])
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
        self._background: set[asyncio.Future[Any]] = set()
        self.depth_sources = DepthSources(interval=config.reconcile_interval / 1000)
        self.depth_poll = DepthPoll(self.gateway, self.depth_sources, self._declarer)
        self._tls_server: asyncio.Server | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._upstream_ssl = upstream_ssl_context(config) if config.upstream_tls else None
        self._outage = OutageLog()
        #: The periodic full collection (the thresholds are the command's).
        self.collector = CollectorPolicy()
        self._management_failures = 0
        #: Set once the first routing snapshot (and stored state) is in.
        self.ready = asyncio.Event()
        self.port = 0
        self.tls_port = 0
        self.admin_port = 0
        #: This gateway as a cluster member (None: standalone).
        self.cluster: ClusterNode | None = None
        if config.cluster:
            self.cluster = self._cluster_node(config.cluster)

    def _cluster_node(self, name: str) -> ClusterNode:
        node = ClusterNode.for_gateway(
            self.gateway,
            self.config,
            name=name,
            describe=lambda: {"listen_port": self.port, "admin_port": self.admin_port},
            refresh_routing=self.refresh_routing,
        )
        self.sink.gateway = node.member
        return node

    async def start(self) -> None:
        """Open the listeners and the admin API at once; load state in the background.

        Until the first routing snapshot is in, ``gateway.ready_error``
        says why the gateway is not ready and :attr:`ready` is not set.

        Raises:
            OSError: a listen address cannot be bound (``ssl.SSLError``: the
                TLS certificate or key cannot be loaded).
        """
        self.gateway.ready_error = (
            "gateway starting: waiting for the first routing snapshot from the "
            f"management API at {self.management.base_url}"
        )
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(loop_exception_handler)
        self._tasks = [asyncio.create_task(self._become_ready(), name="start-up")]
        if self.cluster is not None:
            await self.cluster.start()
        # A healthy RabbitMQ answers within this grace: clients then never
        # meet the not-ready window.  A silent one cannot hold the listener
        # back beyond it.
        await asyncio.wait(self._tasks, timeout=STARTUP_GRACE_S)
        self._tasks.append(asyncio.create_task(self.collector.run(), name="gc-full"))
        listening: dict[str, str] = {}
        address = self.config.listen_address
        if address is not None:
            self._server = await self._listen(address[0], address[1], None)
            self.port = self._server.sockets[0].getsockname()[1]
            listening["listen"] = f"{address[0]}:{self.port}"
        tls_address = self.config.listen_tls_address
        if tls_address is not None:
            self._tls_context = server_ssl_context(self.config)
            self._tls_server = await self._listen(*tls_address, self._tls_context)
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            listening["listen_tls"] = f"{tls_address[0]}:{self.tls_port}"
        if self._admin_app is not None:
            listening["admin"] = await self._serve_admin(self._admin_app)
        _log.info(
            "gateway listening", **listening, upstream="{}:{}".format(*self.config.upstream_address)
        )

    async def _serve_admin(self, admin_app: Callable[[GatewayService], web.Application]) -> str:
        """Serve the admin API on ``--admin-listen``; its ``HOST:PORT``."""
        self._admin = web.AppRunner(admin_app(self), access_log=None)
        await self._admin.setup()
        admin_host, admin_port = self.config.admin_address
        site = web.TCPSite(self._admin, admin_host, admin_port)
        await site.start()
        addresses = self._admin.addresses
        self.admin_port = int(addresses[0][1]) if addresses else admin_port
        return f"{admin_host}:{self.admin_port}"

    async def _become_ready(self) -> None:
        """Load stored state and the first snapshot (retrying), then start the loops."""
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=0.5, max=5.0) + tenacity.wait_random(0, 0.5),
            retry=tenacity.retry_if_result(lambda answered: answered is False),
            before_sleep=self._not_ready_yet,
        )
        await retrying(self.refresh_routing)
        await self._load_stored_state()
        await self.reconcile_once(initial=True)
        await self.measure_store()
        self.gateway.ready_error = None
        self.ready.set()
        _log.info("gateway ready", queues=len(self.gateway.queue_keys()), engine=accel.status())
        self._tasks += [
            asyncio.create_task(self._routing_loop(), name="routing-refresh"),
            asyncio.create_task(self._reconcile_loop(), name="reconcile"),
            asyncio.create_task(self._depth_poll_loop(), name="depth-poll"),
            asyncio.create_task(self._store_loop(), name="store-quota"),
            asyncio.create_task(self.descriptors.watch(self._relisten), name="fd-watch"),
        ]

    async def _listen(self, host: str, port: int, tls: ssl.SSLContext | None) -> asyncio.Server:
        # --workers N: the N processes share the port; the kernel spreads connections.
        return await asyncio.get_running_loop().create_server(
            self._new_relay,
            host,
            port,
            backlog=self.config.listen_backlog,
            ssl=tls,
            reuse_port=self.config.workers > 1 or None,
        )

    async def _relisten(self) -> None:
        """Open again a client listener the event loop closed (uvloop does, when
        accepting fails for want of descriptors); tried again each second."""
        for server, host, port, tls in (
            (self._server, self.config.listen_address, self.port, None),
            (self._tls_server, self.config.listen_tls_address, self.tls_port, self._tls_context),
        ):
            if server is None or host is None or not listener_lost(server):
                continue
            try:
                reopened = await self._listen(host[0], port, tls)
            except OSError as exc:
                _log.error("client listener closed: cannot listen again yet", error=str(exc))
                continue
            _log.error("client listener closed by the event loop: listening again", port=port)
            server.close()
            if tls is None:
                self._server = reopened
            else:
                self._tls_server = reopened

    def _not_ready_yet(self, _state: tenacity.RetryCallState) -> None:
        self.gateway.ready_error = (
            "gateway not ready: no routing snapshot yet from the management API "
            f"at {self.management.base_url} ({self._last_management_error})"
        )

    async def _load_stored_state(self) -> None:
        stored: dict[tuple[str, str], Thresholds] = {}
        try:
            stored = dict(await self.store.load())
            self.gateway.load_runtime_thresholds(stored)
        except PersistenceError as exc:
            _log.warning("runtime thresholds not loaded", error=str(exc))
        # Thresholds are set only on existing queues and forgotten when
        # the gateway sees one deleted; a queue deleted while no gateway
        # ran leaves them behind: forget them now.
        for key in stored:
            if not self.gateway.routing.has_queue(*key):
                _log.info("forgetting thresholds of a deleted queue", vhost=key[0], queue=key[1])
                self.gateway.queue_deleted(*key)
        try:
            stops = await self.store.load_stops()
        except PersistenceError as exc:
            _log.warning("administrator stops not loaded", error=str(exc))
            return
        for vhost, queue in stops:
            self.gateway.stop_producers(vhost=vhost, queue=queue)
        if stops:
            _log.warning(
                "administrator stops restored: producers stay stopped until "
                "rabbitflow-config start-producers",
                stops=[{"vhost": v, "queue": q} for v, q in stops],
            )

    def keep_running(self, task: asyncio.Future[Any]) -> None:
        """Keep a background write alive until it ends (or the service stops)."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self, *, drain_timeout: float | None = None) -> None:
        """Close the listeners, every relayed connection and the admin API.

        With ``drain_timeout`` (SIGTERM), each client first gets its
        in-flight confirms for up to that many seconds, then
        ``Connection.Close`` 320 "gateway shutting down"; without it
        connections are closed at once.
        """
        for task in self._tasks:
            task.cancel()
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
        relays = list(self._relays)
        if drain_timeout is not None and relays:
            _log.info(
                "gateway shutting down: draining in-flight confirms",
                connections=len(relays),
                drain_timeout_s=drain_timeout,
            )
            await asyncio.gather(
                *(r.shutdown("gateway shutting down", drain_timeout) for r in relays),
                return_exceptions=True,
            )
        for relay in relays:
            relay.abort()
        if relays:
            waiters = [asyncio.create_task(r.wait_closed()) for r in relays]
            _done, pending = await asyncio.wait(waiters, timeout=5)
            for waiter in pending:
                waiter.cancel()
        pending_work: list[asyncio.Future[Any]] = [*self._tasks, *self._background]
        if pending_work:
            _finished, stuck = await asyncio.wait(pending_work, timeout=_STOP_STEP_S)
            if stuck:
                _log.warning(
                    "gateway stopping: tasks still running", tasks=len(stuck), after_s=_STOP_STEP_S
                )
        for server in (self._server, self._tls_server):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 2)
        # Each step is bounded: RabbitMQ or a client that stopped answering
        # must not keep the gateway from ending.
        await self._stop_step("depth poll", self.depth_poll.close())
        if self.cluster is not None:
            await self._stop_step("cluster", self.cluster.stop())
        if self._admin is not None:
            await self._stop_step("admin API", self._admin.cleanup())
        await self._stop_step("management client", self.management.close())
        if self._owns_sink:
            self.sink.close()

    async def _stop_step(self, what: str, step: Coroutine[Any, Any, None]) -> None:
        try:
            await asyncio.wait_for(step, _STOP_STEP_S)
        except TimeoutError:
            _log.warning("gateway stopping: step timed out", step=what, after_s=_STOP_STEP_S)
        except Exception as exc:  # stopping goes on whatever one step does
            _log.warning("gateway stopping: step failed", step=what, error=repr(exc))

    def reload_tls(self) -> bool:
        """Reload ``--tls-cert``/``--tls-key``/``--tls-client-ca`` (SIGHUP).

        New handshakes use the new files; connections already open keep
        theirs.  Files that do not load leave the old ones in force.
        Returns whether the files were reloaded.
        """
        if self._tls_context is None:
            return False
        config = self.config
        if config.tls_cert is None or config.tls_key is None:
            return False
        try:
            server_ssl_context(config)  # check first: a bad file must not half-apply
            self._tls_context.load_cert_chain(config.tls_cert, config.tls_key)
            if config.tls_client_ca:
                self._tls_context.load_verify_locations(cafile=config.tls_client_ca)
        except (ssl.SSLError, OSError) as exc:
            _log.error("TLS certificates not reloaded; the old ones stay", error=str(exc))
            return False
        _log.info("TLS certificates reloaded", cert=config.tls_cert)
        return True

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
        relay = Relay(
            self.gateway,
            on_closed=self._relays.discard,
            upstream_ssl=self._upstream_ssl,
            upstream_server_hostname=(
                self.config.upstream_address[0] if self._upstream_ssl is not None else None
            ),
            read_pause=self.read_pause,
            descriptors=self.descriptors,
        )
        self._relays.add(relay)
        return relay

    # -- management-API loops --------------------------------------------------

    _last_management_error = "no answer yet"

    def _management_failed(self, what: str, exc: ManagementError) -> None:
        """One failed call to RabbitMQ's management API: log per :class:`OutageLog`."""
        self._management_failures += 1
        self._last_management_error = str(exc)
        said = self._outage.failed(time.monotonic())
        if said is None:
            return
        down_since = self._outage.down_since
        _log.warning(
            f"upstream {said}",
            management=self.management.base_url,
            failed=what,
            error=str(exc),
            **(
                {"for_s": round(time.monotonic() - down_since)}
                if said == "still lost" and down_since is not None
                else {}
            ),
        )

    def _management_ok(self) -> None:
        outage = self._outage.succeeded(time.monotonic())
        if outage is not None:
            _log.warning(
                "upstream back", management=self.management.base_url, after_s=round(outage, 1)
            )

    async def refresh_routing(self) -> bool:
        """Swap in a fresh routing snapshot unless relayed changes raced it.

        Returns whether RabbitMQ answered (False: the last snapshot stays).
        """
        version = self.gateway.routing_version
        try:
            exchanges, queues, bindings, policies = await self.management.routing_items()
            table = RoutingTable.from_management(exchanges, queues, bindings, policies)
        except ManagementError as exc:
            self._management_failed("routing snapshot", exc)
            return False
        except RoutingError as exc:
            _log.warning("routing snapshot refused", error=str(exc))
            return False
        self._management_ok()
        if self.gateway.routing_version == version:
            self.gateway.routing.replace(table)
        for item in queues:
            self.gateway.queue_seen(
                str(item["vhost"]), str(item["name"]), item_arguments(item), item_policy(item)
            )
        return True

    async def reconcile_once(self, *, initial: bool = False) -> None:
        """Adopt RabbitMQ's depth for queues the gateway left alone meanwhile.

        Which of RabbitMQ's counts is true for which queue type is decided
        by :class:`~rabbitflow_broker.hub.depth_sources.DepthSources`: the
        current totals for classic queues, the statistics (after a longer
        quiet time) for quorum queues and streams, never a 0 or null that
        the totals listing gives for those.
        """
        gateway = self.gateway
        versions = {key: gateway.depth.version(key) for key in gateway.queue_keys()}
        self.depth_sources.gateway_unacked(gateway.unacked_deliveries(), time.monotonic())
        try:
            totals = await self.management.queue_totals()
            stats = await self.management.queue_statistics()
        except ManagementError as exc:
            self._management_failed("depth reconciliation", exc)
            return
        seen: set[tuple[str, str]] = set()
        for item in totals:
            key = (str(item["vhost"]), str(item["name"]))
            seen.add(key)
            if not gateway.knows_queue(*key):
                gateway.queue_seen(key[0], key[1], item_arguments(item), item_policy(item))
                if not gateway.routing.has_queue(*key):
                    gateway.routing.declare_queue(key[0], key[1], item_arguments(item))
            seen_version = versions.get(key, gateway.depth.version(key))
            listed = stats.get(key)
            readings = self.depth_sources.readings(
                key,
                queue_type(item_arguments(item), item.get("type")),
                totals=item.get("messages"),
                stats=None if listed is None else (listed.messages, listed.size),
                seen_version=seen_version,
                initial=initial,
                totals_parts=(item.get("messages_ready"), item.get("messages_unacknowledged")),
                stats_parts=(None, None) if listed is None else (listed.ready, listed.unacked),
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
                self._management_ok()
        except ManagementError as exc:
            self._management_failed("store size", exc)
            return
        except OSError as exc:
            _log.warning("store size not measured", error=str(exc))
            return
        for vhost, size in sizes.items():
            self.gateway.store_quotas.observe(vhost, size, source)

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

    def _declarer(self, vhost: str) -> PassiveDeclarer:
        (host, port), *more = self.config.upstream_addresses
        user, password = self.config.upstream_credentials
        return PassiveDeclarer(
            host,
            port,
            more=more,
            user=user,
            password=password,
            vhost=vhost,
            ssl_context=self._upstream_ssl,
            server_hostname=host,
        )

    async def _depth_poll_loop(self) -> None:
        interval = self.config.depth_poll_interval / 1000
        if not interval:
            return
        while True:
            await asyncio.sleep(interval)
            await self.depth_poll.poll_once()

    async def _reconcile_loop(self) -> None:
        interval = self.config.reconcile_interval / 1000
        if not interval:
            return
        while True:
            await asyncio.sleep(interval)
            failures = self._management_failures
            await self.reconcile_once()
            if self._management_failures == failures:
                self._management_ok()
