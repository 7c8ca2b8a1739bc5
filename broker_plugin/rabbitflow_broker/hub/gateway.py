"""State shared by all connections of one gateway.

:class:`Gateway` owns the routing table, the depth of every queue, the per-queue
threshold machines, the runtime thresholds and the event sink.  Connections (one
engine and driver per client connection) report what they relay; the gateway
updates depth, runs the machines and emits events.  It never calls into a
connection: what changed in blocking (queues ON or OFF, vhosts whose producers may
be freed) accumulates as :class:`Changes`, which the driver takes when
:attr:`Gateway.on_change` says some are pending (:meth:`Gateway.take_changes`), to
re-check the connections concerned later, outside any change and any engine call.

Blocking is decided in one place, :meth:`Gateway.is_blocked`: a queue is blocked while
its flow is ON, while an administrator stopped its producers (:meth:`Gateway.stop_producers`
with a queue) or while a vhost-wide block is active.  Vhost-wide blocks are the store
quota (:mod:`~rabbitflow_broker.engine.store`, fed through :attr:`Gateway.store_quotas`)
and administrator stops of one vhost or of all; they name ``** All Queues **`` in
CHN-1005.  Each blocker is independent: lifting one leaves the others in force.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from typing import Any

from rabbitflow_broker.engine import amqp, mirror
from rabbitflow_broker.engine.cluster_book import DUE, NEW_HOLD, MemberBook
from rabbitflow_broker.engine.depth import DepthTracker, QueueKey
from rabbitflow_broker.engine.flow import FlowState, QueueFlow, Thresholds
from rabbitflow_broker.engine.frames import FrameError
from rabbitflow_broker.engine.ports import Hub
from rabbitflow_broker.engine.routing import RoutingError, RoutingTable
from rabbitflow_broker.events import ALL_QUEUES, Event
from rabbitflow_broker.hub.admin_stops import AdminStops
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.ports import (
    BlockedChannel,
    Changes,
    ClusterLink,
    Connection,
    QueueSnapshot,
)
from rabbitflow_broker.hub.store_quota import StoreQuotas
from rabbitflow_broker.hub.thresholds import ThresholdBook
from rabbitflow_broker.hub.views import AdminViewsMixin

__all__ = ["BlockedChannel", "Changes", "ClusterLink", "Connection", "Gateway", "QueueSnapshot"]

Route = frozenset[str]

_NO_HOLDS: set[QueueKey] = set()
_INF = float("inf")
_DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"  # direct reply-to's keys: no declared queue


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Gateway(AdminViewsMixin, Hub):
    """Shared state of the gateway; every method is synchronous and quick."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        sink: Callable[[Event], None],
        routing: RoutingTable | None = None,
        clock: Callable[[], dt.datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.routing = routing if routing is not None else RoutingTable()
        self.depth = DepthTracker()
        self._sink = sink
        self._clock = clock
        self._monotonic = monotonic
        self._flows: dict[QueueKey, QueueFlow] = {}
        # Queues whose machine is ON, kept by _observe (the only caller of a
        # machine's observe); every blocking decision reads it.  While empty
        # (and no administrator stop) the per-publish checks end at once.
        self._stopped: set[QueueKey] = set()
        # Queues OFF but at or above a resume threshold, kept by _observe too:
        # with the ON ones, the queues whose depth the service polls often.
        self._near: set[QueueKey] = set()
        #: Each queue's thresholds and their sources (arguments, policy, runtime).
        self.thresholds = ThresholdBook(config)
        self._connections: dict[int, Connection] = {}
        self._next_connection = 0
        self._upstream_cursor = 0
        # Vhost-wide blocks set directly (tests, embedding); see set_vhost_blocked.
        self._forced_vhosts: set[str] = set()
        # Administrator stops: (vhost or None = every vhost, queue or None = every queue).
        self.stops = AdminStops()
        #: The store quota of every vhost (an overfull one blocks the vhost).
        self.store_quotas = StoreQuotas(
            config, sink=sink, clock=clock, monotonic=monotonic, wake=self.wake
        )
        #: Called with a queue whose runtime thresholds went with the queue.
        self.runtime_forgotten: Callable[[QueueKey], None] = lambda key: None
        #: Bumped by every routing change relayed, so a stale snapshot is not swapped in.
        self.routing_version = 0
        #: While set, new client connections are refused with 320 and this text.
        self.ready_error: str | None = None
        #: Called when changes become pending (set by the driver, which then
        #: calls :meth:`take_changes` soon); None: nobody takes them.
        self.on_change: Callable[[], None] | None = None
        self._changes: Changes | None = None
        #: True while nothing blocks any producer (see :meth:`_update_calm`).
        self.calm = True
        #: The cluster member this hub belongs to (None: a standalone gateway).
        self.cluster: ClusterLink | None = None
        # The cluster's holds (the same set objects for the hub's lifetime,
        # so the predicates handed to engines read them as they change).
        self._held: set[QueueKey] = _NO_HOLDS
        self._flowed: set[QueueKey] = _NO_HOLDS
        self._book: MemberBook | None = None
        self._shared: dict[QueueKey, tuple[int, int, int]] = {}  # see AdminViewsMixin

    def join_cluster(self, cluster: ClusterLink) -> None:
        """Make this hub a cluster member's (the owner decides flow; completions need allowance)."""
        self.cluster = cluster
        self._book = cluster.book
        self._held = cluster.book.held
        self._flowed = cluster.book.flowed

    # -- connections ---------------------------------------------------------

    def register(self, connection: Connection) -> None:
        """Add a relay to the set that is refreshed on unblock."""
        self._connections[connection.number] = connection

    def unregister(self, connection: Connection) -> None:
        """Remove a relay (its connection ended)."""
        self._connections.pop(connection.number, None)

    def upstream_nodes(self) -> list[tuple[str, int]]:
        """The RabbitMQ nodes to try for a new connection, in order: each
        connection starts from the next one (round robin)."""
        nodes = self.config.upstream_addresses
        start = self._upstream_cursor % len(nodes)
        self._upstream_cursor += 1
        return nodes[start:] + nodes[:start]

    def next_connection_number(self) -> int:
        """The gateway's own connection counter, as printed in ``con:N``."""
        self._next_connection += 1
        return self._next_connection

    @property
    def connections(self) -> list[Connection]:
        """Live relays."""
        return list(self._connections.values())

    def unacked_deliveries(self) -> dict[QueueKey, int]:
        """Deliveries relayed to clients and not acknowledged yet, per queue."""
        counts: dict[QueueKey, int] = {}
        for connection in self._connections.values():
            connection.count_unacked(counts)
        return counts

    def route(self, vhost: str, exchange: str, key: str, headers: Any) -> Route:
        """The queues a publish is enqueued on (empty when the mirror cannot tell)."""
        try:
            route = self.routing.route(vhost, exchange, key, headers)
        except (RoutingError, FrameError):
            return frozenset()
        if not route and exchange == "" and key and self.cluster is not None:
            # Perhaps a queue another member declared (the owner finds out).
            return route if key.startswith(_DIRECT_REPLY_TO) else frozenset((key,))
        return route

    def confirmed(
        self, vhost: str, request: int, args: list[object], reply: Any, last_queue: str
    ) -> None:
        """RabbitMQ confirmed a client's request: follow it in the routing mirror."""
        mirror.apply(self, vhost, request, args, reply, last_queue=last_queue)
        if self.cluster is not None:
            if request == amqp.QUEUE_DELETE:  # gone for sure: on every member
                self.cluster.queue_deleted(vhost, amqp.text(args[1]) or last_queue)
            self.cluster.definitions_changed(vhost)

    def emit(self, event: Event) -> None:
        """Send an event to the sink (console and event log)."""
        self._sink(event)

    def now(self) -> dt.datetime:
        """Wall-clock time for event timestamps."""
        return self._clock()

    def monotonic(self) -> float:
        """Monotonic seconds for durations (settle times, flow enforcement)."""
        return self._monotonic()

    # -- thresholds (decided by self.thresholds, applied to the machines) -------

    def validate_declare(self, arguments: Mapping[str, object] | None) -> None:
        """Check ``qpid.flow_*`` declare arguments (raises ThresholdError)."""
        self.thresholds.validate_declare(arguments)

    def flow(self, key: QueueKey) -> QueueFlow:
        """The queue's machine, created (with its thresholds) on first use."""
        machine = self._flows.get(key)
        if machine is None:
            machine = self._flows[key] = QueueFlow(key[0], key[1], self.thresholds.compute(key))
        return machine

    def _rethreshold(self, key: QueueKey) -> None:
        machine = self.flow(key)
        machine.thresholds = self.thresholds.compute(key)
        self._observe(key)

    def knows_queue(self, vhost: str, name: str) -> bool:
        """True when the queue was declared through the gateway or seen in a snapshot."""
        key = (vhost, name)
        return self.thresholds.knows(key) or key in self.depth

    def queue_declared(
        self,
        vhost: str,
        name: str,
        arguments: Mapping[str, object] | None,
        policy: Mapping[str, object] | None = None,
    ) -> None:
        """RabbitMQ confirmed a declare (or a snapshot listed the queue)."""
        key = (vhost, name)
        self.thresholds.declared(key, arguments, policy)
        self.depth.get(key)
        self._rethreshold(key)

    def queue_seen(
        self,
        vhost: str,
        name: str,
        arguments: Mapping[str, object] | None,
        policy: Mapping[str, object] | None,
    ) -> None:
        """A management snapshot listed the queue; update it only if it changed."""
        key = (vhost, name)
        if self.thresholds.seen(key, arguments, policy):
            self.depth.get(key)
            self._rethreshold(key)

    def queue_deleted(self, vhost: str, name: str) -> None:
        """RabbitMQ confirmed a queue delete; its runtime thresholds go too."""
        key = (vhost, name)
        if self.thresholds.deleted(key):
            self.runtime_forgotten(key)
        self.depth.forget(key)
        machine = self._flows.pop(key, None)
        self._shared.pop(key, None)
        self._stopped.discard(key)
        self._near.discard(key)
        # The cluster's books keep the queue: a snapshot that misses it for a
        # moment (a node stopping) must not free its holds or reset the
        # owner's count of it.
        if machine is not None and machine.stopped:
            self.wake(vhost)

    def set_runtime_thresholds(
        self, vhost: str, name: str, changes: Mapping[str, object]
    ) -> Thresholds:
        """Apply admin-API threshold changes (:meth:`ThresholdBook.set_runtime
        <rabbitflow_broker.hub.thresholds.ThresholdBook.set_runtime>`); returns those in force.

        Raises:
            ThresholdError: unknown key, bad value, or any threshold on a
                stream, naming it.
        """
        key = (vhost, name)
        kept = self.thresholds.set_runtime(key, changes)
        self._rethreshold(key)
        if self.cluster is not None:  # as kept: each member derives an unset resume
            self.cluster.thresholds_changed(key, kept)
        return self.flow(key).thresholds

    def load_runtime_thresholds(self, stored: Mapping[QueueKey, Thresholds | None]) -> None:
        """Install thresholds kept across restarts, or the cluster's (None: forget them)."""
        for key, thresholds in stored.items():
            if self.thresholds.load_runtime(key, thresholds) and thresholds is None:
                self.runtime_forgotten(key)
            if key in self._flows:
                self._rethreshold(key)

    def runtime_thresholds(self, vhost: str, name: str) -> Thresholds | None:
        """The thresholds set at run time for a queue, if any."""
        return self.thresholds.runtime((vhost, name))

    # -- blocking ------------------------------------------------------------

    def vhost_blocked(self, vhost: str) -> bool:
        """True while every producer of the vhost is blocked (store quota, admin stop)."""
        stops = self.stops.keys  # inline: this runs per publish
        if stops and ((None, None) in stops or (vhost, None) in stops):
            return True
        if self._forced_vhosts and vhost in self._forced_vhosts:
            return True
        return vhost in self.store_quotas.overfull

    def is_blocked(self, vhost: str, queue: str) -> bool:
        """True while publishes to the queue must not complete."""
        key = (vhost, queue)
        return (
            key in self._stopped
            or key in self._held
            or self.vhost_blocked(vhost)
            or self.stops.queue_stopped(vhost, queue)
        )

    def route_blocker(self, vhost: str) -> Callable[[Route], bool]:
        """A predicate for :class:`~rabbitflow_broker.engine.confirms.ConfirmTracker`."""
        if self.vhost_blocked(vhost):
            return lambda route: True
        on = self._stopped
        held = self._held
        stops = self.stops.keys
        stopped = self.stops.queue_stopped

        def blocked(route: Route) -> bool:
            if not on and not stops and not held:
                return False
            return any(
                (vhost, queue) in on or (vhost, queue) in held or stopped(vhost, queue)
                for queue in route
            )

        return blocked

    def blockers(self, vhost: str, route: Route) -> list[str]:
        """What blocks a publish on this route, in the order CHN-1005 names them.

        ``** All Queues **`` first when the whole vhost is blocked, then the
        route's overfull or administratively stopped queues by name; empty
        when nothing blocks.
        """
        found = [ALL_QUEUES] if self.vhost_blocked(vhost) else []
        on = self._stopped
        flowed = self._flowed
        for queue in sorted(route):
            key = (vhost, queue)
            if key in on or key in flowed or self.stops.queue_stopped(vhost, queue):
                found.append(queue)
        return found

    def blocker_active(self, vhost: str, blocker: str) -> bool:
        """Whether a channel's recorded blocker still holds."""
        if blocker == ALL_QUEUES:
            return self.vhost_blocked(vhost)
        return self.is_blocked(vhost, blocker)

    def set_vhost_blocked(self, vhost: str, blocked: bool) -> None:
        """Block or free every producer of a vhost, independently of quota and admin stops."""
        if blocked:
            self._forced_vhosts.add(vhost)
        else:
            self._forced_vhosts.discard(vhost)
        self.wake(vhost)

    # -- store quota (the engine's side; the service feeds self.store_quotas) --

    @property
    def store_quota_on(self) -> bool:
        """True when ``--store-overfull-size`` is set."""
        return self.store_quotas.on

    def persistent_published(self, vhost: str, size: int) -> None:
        """Persistent bytes just relayed to a vhost (the store quota counts them)."""
        self.store_quotas.persistent_published(vhost, size)

    # -- administrator stops -----------------------------------------------

    def stop_producers(self, *, vhost: str | None = None, queue: str | None = None) -> None:
        """Block producers like an overfull queue until :meth:`start_producers`.

        No argument: every vhost; ``vhost``: every queue of it (CHN-1005
        names ``** All Queues **``); ``queue``: publishes routed to that
        queue (in ``vhost``, or in every vhost when ``vhost`` is None;
        CHN-1005 names the queue).  Stopping twice is the same as once.
        """
        self.stops.add(vhost, queue)
        self.wake(vhost)
        if self.cluster is not None:
            self.cluster.stops_changed()

    def start_producers(self, *, vhost: str | None = None, queue: str | None = None) -> None:
        """Lift the administrator stop with exactly these arguments (others stay).

        Starting what was not stopped does nothing.
        """
        if self.stops.remove(vhost, queue):
            self.wake(vhost)
            if self.cluster is not None:
                self.cluster.stops_changed()

    def replace_admin_stops(self, stops: list[tuple[str | None, str | None]]) -> None:
        """Take the cluster's administrator stops as they are (no broadcast)."""
        if self.stops.replace(stops):
            self.wake(None)

    def wake(self, vhost: str | None) -> None:
        """Blocking changed in ``vhost`` (None: every vhost): connections
        there must re-check what they hold and which channels they flow."""
        self._update_calm()
        changes = self._pending()
        if changes is not None:
            changes.vhosts.add(vhost)

    def _update_calm(self) -> None:
        """Renew :attr:`calm` after any change to what blocks producers (every
        such change passes here: through :meth:`wake` or :meth:`_observe`)."""
        self.calm = not (
            self._stopped
            or self._held
            or self.stops.keys
            or self._forced_vhosts
            or self.store_quotas.overfull
        )

    def _pending(self) -> Changes | None:
        """The changes to add to (None while no driver takes them)."""
        if self.on_change is None:
            return None
        changes = self._changes
        if changes is None:
            changes = self._changes = Changes()
            self.on_change()
        return changes

    def take_changes(self) -> Changes | None:
        """What changed since the last call (None: nothing)."""
        changes, self._changes = self._changes, None
        return changes

    # -- depth ---------------------------------------------------------------

    def _observe(self, key: QueueKey) -> None:
        """Feed the queue's depth to its threshold machine, then set the
        depth's quiet window (see :class:`~rabbitflow_broker.engine.depth.QueueDepth`)
        so that publishes and removals that cannot change the state skip it."""
        machine = self.flow(key)
        depth = self.depth.get(key)
        event = machine.observe(depth.messages, depth.bytes, self._clock())
        t = machine.thresholds
        cluster = self.cluster
        decides = cluster is None or cluster.owner
        if machine.stopped:
            if decides:
                self._stopped.add(key)
                self.calm = False
            depth.hi_messages = depth.hi_bytes = _INF  # publishes keep it ON
            depth.lo_messages = float(t.resume_count) if t.stop_count else _INF
            depth.lo_bytes = float(t.resume_size) if t.stop_size else _INF
        else:
            if decides:
                self._stopped.discard(key)
            near_count = float(max(t.resume_count, 1)) if t.stop_count else _INF
            near_size = float(max(t.resume_size, 1)) if t.stop_size else _INF
            if depth.messages >= near_count or depth.bytes >= near_size:
                # Near its stop: polled often; a removal under resume leaves.
                self._near.add(key)
                depth.hi_messages = float(t.stop_count or _INF)
                depth.hi_bytes = float(t.stop_size or _INF)
                depth.lo_messages, depth.lo_bytes = near_count, near_size
            else:
                self._near.discard(key)
                # A publish reaching a resume threshold makes it near.
                depth.hi_messages = near_count - 1 if t.stop_count else _INF
                depth.hi_bytes = near_size - 1 if t.stop_size else _INF
                depth.lo_messages = depth.lo_bytes = -1.0  # removals keep it OFF
        if event is None or not decides:
            return  # a cluster member that does not own the accounting: the owner decides
        self._sink(event)
        if cluster is not None:  # first: an OFF queue's holds are paid (see wake)
            cluster.flow_changed(key, machine.stopped)
        if not machine.stopped:  # QUE-1004: the vhost's producers may go on
            self.wake(key[0])
        changes = self._pending()
        if changes is not None:
            (changes.went_on if machine.stopped else changes.went_off).add(key)

    # -- cluster -------------------------------------------------------------

    def set_cluster_flow(self, on: set[QueueKey]) -> None:
        """The owner's ON queues (a member that does not own the accounting):
        they block as overfull queues do here; the others are freed."""
        went_on = on - self._stopped
        went_off = self._stopped - on
        if not went_on and not went_off:
            return
        for key in went_on:
            self.flow(key).force(FlowState.ON, self._clock())
            self._stopped.add(key)
        for key in went_off:
            machine = self._flows.get(key)
            if machine is not None:
                machine.force(FlowState.OFF, self._clock())
            self._stopped.discard(key)
        self._update_calm()
        changes = self._pending()
        if changes is not None:
            changes.went_on.update(went_on)
            changes.went_off.update(went_off)
            changes.vhosts.update(key[0] for key in went_on | went_off)

    def take_ownership(self) -> None:
        """This member now owns the accounting: its depth starts from the owner's
        last broadcast where higher (that owner counted every member's traffic)."""
        for key, (messages, size, _count) in self._shared.items():
            self.depth.raise_to(key, messages, size, self._monotonic())
        self._shared.clear()
        for key in list(self._flows):
            self._observe(key)

    def holds_changed(self, vhosts: set[str]) -> None:
        """The cluster's holds changed in these vhosts: re-check what is held."""
        self._update_calm()
        changes = self._pending()
        if changes is not None:
            changes.vhosts.update(vhosts)

    def shared_depths(self, shared: dict[QueueKey, tuple[int, int, int]] | None) -> None:
        """The owner's depth and flowStoppedCount of these queues, for the admin
        API (a member); None: the owner cannot be heard, show this hub's own."""
        if shared is None:
            self._shared.clear()
        self._shared.update(shared or {})

    def remote_depth(self, key: QueueKey, messages: int, size: int) -> None:
        """Owner: other members enqueued (+) or removed (-) messages of the queue."""
        if not messages and not size:
            return
        depth = self.depth.add(key, messages, size, self._monotonic())
        if (
            depth.messages > depth.hi_messages
            or depth.bytes > depth.hi_bytes
            or (depth.messages < depth.lo_messages and depth.bytes < depth.lo_bytes)
        ):
            self._observe(key)

    def published(self, vhost: str, route: Route, size: int) -> None:
        """A publish routed to ``route`` was relayed (or a transaction committed)."""
        now = self._monotonic()
        tracker = self.depth
        book, flags = self._book, 0
        for queue in route:
            key = (vhost, queue)
            depth = tracker.add(key, 1, size, now)
            if depth.messages > depth.hi_messages or depth.bytes > depth.hi_bytes:
                self._observe(key)
            if book is not None:
                if depth.prepaid and now < depth.prepaid_until:
                    depth.prepaid -= 1  # allowance the member's book set aside here
                    depth.prepaid_bytes += size
                else:
                    flags |= book.spend(key, size, now, depth)
        if flags & NEW_HOLD:
            self.calm = False
        if flags & (NEW_HOLD | DUE) and self.cluster is not None:
            self.cluster.kick()

    def removed(self, vhost: str, queue: str, messages: int, size: int) -> None:
        """Messages left a queue (acked, rejected, no-ack delivery, nacked publish)."""
        key = (vhost, queue)
        depth = self.depth.add(key, -messages, -size, self._monotonic())
        if depth.messages < depth.lo_messages and depth.bytes < depth.lo_bytes:
            self._observe(key)
        if self._book is not None:  # the book directly: this is per ack
            self._book.removed(key, messages, size)

    def purged(self, vhost: str, queue: str, count: int) -> None:
        """RabbitMQ purged ``count`` ready messages."""
        key = (vhost, queue)
        self.depth.purge(key, count, self._monotonic())
        self._observe(key)

    def reconcile(
        self,
        vhost: str,
        queue: str,
        *,
        messages: int,
        size: int | None,
        seen_version: int,
        settle: float,
    ) -> None:
        """Adopt RabbitMQ's count for a queue the gateway left alone meanwhile."""
        key = (vhost, queue)
        if self.depth.reconcile(
            key,
            messages=messages,
            size=size,
            seen_version=seen_version,
            now=self._monotonic(),
            settle=settle,
        ):
            self._observe(key)
