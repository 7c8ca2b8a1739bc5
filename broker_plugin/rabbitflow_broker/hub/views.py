"""What the admin API and metrics see of the gateway (read-only views).

:class:`AdminViewsMixin` builds the admin API's shapes
(:class:`~rabbitflow_broker.hub.ports.BlockedChannel`,
:class:`~rabbitflow_broker.hub.ports.QueueSnapshot`) (and the other read-only
summaries) for :class:`~rabbitflow_broker.hub.gateway.Gateway` from its state,
which it never changes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from mypy_extensions import trait

from rabbitflow_broker.engine.depth import DepthTracker, QueueKey
from rabbitflow_broker.engine.flow import QueueFlow
from rabbitflow_broker.events import ALL_QUEUES
from rabbitflow_broker.hub.admin_stops import AdminStops
from rabbitflow_broker.hub.ports import BlockedChannel, ClusterLink, Connection, QueueSnapshot
from rabbitflow_broker.hub.thresholds import ThresholdBook

__all__ = ["AdminViewsMixin"]


@trait
class AdminViewsMixin:
    """The snapshot builders of :class:`~rabbitflow_broker.hub.gateway.Gateway`."""

    # The gateway's state these read, set by Gateway.__init__.
    depth: DepthTracker
    _clock: Callable[[], dt.datetime]
    _connections: dict[int, Connection]
    thresholds: ThresholdBook
    _flows: dict[QueueKey, QueueFlow]
    _stopped: set[QueueKey]
    _near: set[QueueKey]
    stops: AdminStops
    # In a cluster: the owner's depth (messages, bytes) and flowStoppedCount of
    # each queue as last published (a member that does not own the accounting shows these).
    _shared: dict[QueueKey, tuple[int, int, int]]
    cluster: ClusterLink | None

    def flow(self, key: QueueKey) -> QueueFlow:
        """Gateway's (a trait: compiled, Gateway mixes it in)."""
        raise NotImplementedError

    # -- flow state ----------------------------------------------------------

    def flowed_queues(self) -> list[QueueKey]:
        """Queues overfull (flow ON) as this hub decided or was told."""
        return sorted(self._stopped)

    def admin_stop_keys(self) -> list[tuple[str | None, str | None]]:
        """Administrator stops as (vhost, queue) pairs, oldest first."""
        return list(self.stops.keys)

    def admin_stops(self) -> list[dict[str, str | None]]:
        """Current administrator stops, oldest first."""
        return self.stops.listing()

    def queue_on(self, key: QueueKey) -> bool:
        """Whether the queue is overfull (flow ON), as this hub knows it."""
        return key in self._stopped

    def hot_queues(self) -> list[QueueKey]:
        """Queues whose depth matters now: flowed (ON) or near their stop
        threshold (OFF at or above a resume threshold)."""
        return [*self._stopped, *(self._near - self._stopped)]

    def depth_view(self, key: QueueKey) -> tuple[int, int, int]:
        """The queue's depth (messages, bytes) and flowStoppedCount as this
        hub counts them (a cluster's owner publishes these to the others)."""
        depth = self.depth.get(key) if key in self.depth else None
        machine = self._flows.get(key)
        return (
            depth.messages if depth is not None else 0,
            depth.bytes if depth is not None else 0,
            machine.flow_stopped_count if machine is not None else 0,
        )

    # -- snapshots -----------------------------------------------------------

    def held_confirms(self) -> int:
        """Confirms and commit-oks held from clients, across every channel."""
        return sum(connection.held_confirms() for connection in self._connections.values())

    def queue_keys(self) -> list[QueueKey]:
        """Every queue the gateway knows, sorted."""
        return sorted(set(self.thresholds.declared_queues()) | set(self.depth))

    def blocked_channels(self) -> list[BlockedChannel]:
        """Every flowed channel of every connection."""
        return [c for conn in self._connections.values() for c in conn.blocked_channels()]

    def snapshot(self, vhost: str, name: str) -> QueueSnapshot:
        """The admin API view of one queue.  A cluster member that does not own
        the accounting shows the owner's: its flow state as last told, its
        depth and flowStoppedCount as last published (until then its own)."""
        key = (vhost, name)
        machine = self.flow(key)
        messages, size, stopped_count = self.depth_view(key)
        stopped = machine.stopped
        cluster = self.cluster
        if cluster is not None and not cluster.owner:
            messages, size, stopped_count = self._shared.get(key, (messages, size, stopped_count))
            stopped = key in self._stopped
        blocked = tuple(
            c
            for c in self.blocked_channels()
            if c.vhost == vhost and (name in c.blocked_on or ALL_QUEUES in c.blocked_on)
        )
        return QueueSnapshot(
            vhost=vhost,
            name=name,
            messages=messages,
            bytes=size,
            thresholds=machine.thresholds,
            source=self.thresholds.source(key),
            flow_stopped=stopped,
            flow_stopped_count=stopped_count,
            blocked_channels=blocked,
            flow_stopped_seconds=machine.stopped_seconds(self._clock()),
        )

    def snapshots(self) -> list[QueueSnapshot]:
        """The admin API view of every known queue."""
        return [self.snapshot(vhost, name) for vhost, name in self.queue_keys()]
