"""The hub's side of a cluster member, for hub tests that leave the bus out."""

from __future__ import annotations

from rabbitflow_broker.engine.cluster_book import MemberBook, OwnerBook, QueueKey
from rabbitflow_broker.engine.flow import Thresholds


class QuietLink:
    """A :class:`~rabbitflow_broker.hub.ports.ClusterLink` that tells no one:
    the member's book, and no owner book unless a test sets one."""

    def __init__(self, *, owner: bool = False, batch: int = 10) -> None:
        self.owner = owner
        self.book = MemberBook("m1", batch=batch, lease=2.0)
        self.owner_book: OwnerBook | None = None

    def kick(self) -> None:
        pass

    def flow_changed(self, key: QueueKey, stopped: bool) -> None:
        pass

    def stops_changed(self) -> None:
        pass

    def definitions_changed(self, vhost: str) -> None:
        pass

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds) -> None:
        pass
