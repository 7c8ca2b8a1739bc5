"""What the hub shares with the layers that use it: the changes it reports,
what it reads of a relayed connection (:class:`Connection`) and of the
cluster member it belongs to (:class:`ClusterLink`), and the rows of its
admin views.  The hub never calls into a connection."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rabbitflow_broker.engine.cluster_book import MemberBook, OwnerBook
from rabbitflow_broker.engine.depth import QueueKey
from rabbitflow_broker.engine.flow import Thresholds, ThresholdsSource

__all__ = ["BlockedChannel", "Changes", "ClusterLink", "Connection", "QueueSnapshot"]


@dataclass(frozen=True, slots=True)
class BlockedChannel:
    """A client channel currently sent ``Channel.Flow(active=false)``."""

    connection: int
    channel: int
    user: str
    remote: str
    vhost: str
    blocked_on: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Admin API shape."""
        return {
            "connection": self.connection,
            "channel": self.channel,
            "user": self.user,
            "remote": self.remote,
            "vhost": self.vhost,
            "blockedOn": list(self.blocked_on),
        }


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """A queue as the admin API shows it."""

    vhost: str
    name: str
    messages: int
    bytes: int
    thresholds: Thresholds
    source: ThresholdsSource
    flow_stopped: bool
    flow_stopped_count: int
    blocked_channels: tuple[BlockedChannel, ...]
    flow_stopped_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Admin API JSON."""
        return {
            "name": self.name,
            "vhost": self.vhost,
            "messages": self.messages,
            "bytes": self.bytes,
            **self.thresholds.to_json(),
            "source": self.source,
            "flowStopped": self.flow_stopped,
            "flowStoppedCount": self.flow_stopped_count,
            "flowStoppedSeconds": round(self.flow_stopped_seconds, 3),
            "blockedChannels": [c.to_json() for c in self.blocked_channels],
        }


@dataclass(slots=True)
class Changes:
    """What changed in blocking since the driver last took the changes."""

    #: Vhosts whose connections must re-check what they hold (None: every vhost).
    vhosts: set[str | None] = field(default_factory=set)
    #: Queues whose flow went ON, and OFF (a queue may be in both).
    went_on: set[QueueKey] = field(default_factory=set)
    went_off: set[QueueKey] = field(default_factory=set)

    def concerns(self, vhost: str) -> bool:
        """Whether a connection to ``vhost`` must re-check."""
        return vhost in self.vhosts or None in self.vhosts


class Connection(Protocol):
    """What the gateway's admin views read from a relay (it never calls into one)."""

    number: int

    def held_confirms(self) -> int:
        """Confirms (and commit-oks) currently held from the client."""

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        """Channels of this connection currently flowed."""

    def channel_count(self) -> int:
        """Open channels."""

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        """Admin API view of this connection's channels."""

    def count_unacked(self, into: dict[QueueKey, int]) -> None:
        """Add the deliveries this connection's clients have not acknowledged
        yet, per (vhost, queue), to ``into``."""


class ClusterLink(Protocol):
    """What the hub asks of the cluster member it belongs to (see cluster_node)."""

    #: True while this member owns the cluster's accounting (decides flow).
    owner: bool
    #: The member's allowances (holds: ``book.held``, ``book.flowed``).
    book: MemberBook
    #: The grant ledgers while this member owns the accounting, else None.
    owner_book: OwnerBook | None

    def kick(self) -> None: ...

    def flow_changed(self, key: QueueKey, stopped: bool) -> None: ...

    def stops_changed(self) -> None: ...

    def definitions_changed(self, vhost: str) -> None: ...

    def queue_deleted(self, vhost: str, name: str) -> None: ...

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds) -> None: ...
