"""Per-queue depth accounting (pure).

Depth is what RabbitMQ holds for a queue and has not had acknowledged:
ready + unacknowledged messages and their body bytes.  The gateway counts
it from the traffic it relays (:class:`DepthTracker`), keeps per channel
which delivery tag belongs to which queue and size
(:class:`ChannelDeliveries`), and reconciles with RabbitMQ's own counts so
that traffic bypassing the gateway, TTL expiry and dead-lettering do not
leave it wrong.

Reconciliation never races the gateway's own traffic: RabbitMQ's count
for a queue is taken only when the gateway changed nothing for that queue
between the moment the request was sent and the answer (the caller passes
the :meth:`DepthTracker.version` it saw before asking) and for a settle
time before that, so a publish still in flight to RabbitMQ is never
mistaken for bypass traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ChannelDeliveries", "Delivery", "DepthTracker", "QueueDepth", "QueueKey"]

QueueKey = tuple[str, str]  # (vhost, queue name)


@dataclass(slots=True)
class QueueDepth:
    """Messages and body bytes of one queue; ``version`` counts changes.

    ``hi_*`` and ``lo_*`` are the quiet window the owner of the queue's
    threshold machine sets: while a publish leaves ``messages`` and ``bytes``
    at or below ``hi_*``, and while a removal leaves either at or above its
    ``lo_*``, the machine cannot change state and need not be consulted.
    A new entry's window is empty (the first change is always judged).
    """

    messages: int = 0
    bytes: int = 0
    version: int = 0
    changed_at: float = float("-inf")
    hi_messages: float = -1
    hi_bytes: float = -1
    lo_messages: float = float("inf")
    lo_bytes: float = float("inf")
    #: Allowance a cluster member set aside for the queue's next publishes
    #: (``MemberBook.spend``): while ``prepaid_until`` is ahead, a publish
    #: takes one and adds its size to ``prepaid_bytes``, without asking the book.
    prepaid: int = 0
    prepaid_bytes: int = 0
    prepaid_until: float = float("-inf")


class DepthTracker:
    """Depth of every queue the gateway knows, keyed by (vhost, name)."""

    def __init__(self) -> None:
        self._queues: dict[QueueKey, QueueDepth] = {}

    def __contains__(self, key: QueueKey) -> bool:
        return key in self._queues

    def __iter__(self) -> Iterator[QueueKey]:
        return iter(list(self._queues))

    def get(self, key: QueueKey) -> QueueDepth:
        """The queue's depth, creating an empty entry on first sight."""
        depth = self._queues.get(key)
        if depth is None:
            depth = self._queues[key] = QueueDepth()
        return depth

    def version(self, key: QueueKey) -> int:
        """A number that changes whenever the gateway changes the queue's depth."""
        depth = self._queues.get(key)
        return depth.version if depth else 0

    def add(self, key: QueueKey, messages: int, size: int, now: float) -> QueueDepth:
        """Count messages entering (positive) or leaving (negative) the queue.

        Depth never goes below zero: a removal the gateway did not see the
        entry of (e.g. a message published directly to RabbitMQ) cannot make
        it negative before reconciliation catches up.
        """
        depth = self._queues.get(key)
        if depth is None:
            depth = self._queues[key] = QueueDepth()
        count = depth.messages + messages
        if count > 0:
            depth.messages = count
            size += depth.bytes
            depth.bytes = size if size > 0 else 0
        else:
            depth.messages = depth.bytes = 0
        depth.version += 1
        depth.changed_at = now
        return depth

    def raise_to(self, key: QueueKey, messages: int, size: int, now: float) -> QueueDepth:
        """At least ``messages`` and ``size`` bytes: a count known to be no lower
        (a cluster owner's last broadcast, taken over by its successor)."""
        depth = self.get(key)
        more, more_bytes = messages - depth.messages, size - depth.bytes
        if more > 0 or more_bytes > 0:
            return self.add(key, max(0, more), max(0, more_bytes), now)
        return depth

    def purge(self, key: QueueKey, purged: int, now: float) -> QueueDepth:
        """RabbitMQ purged ``purged`` ready messages; bytes shrink in proportion."""
        depth = self.get(key)
        if depth.messages:
            remaining = max(0, depth.messages - purged)
            depth.bytes = depth.bytes * remaining // depth.messages
            depth.messages = remaining
        depth.version += 1
        depth.changed_at = now
        return depth

    def forget(self, key: QueueKey) -> None:
        """The queue was deleted."""
        self._queues.pop(key, None)

    def reconcile(
        self,
        key: QueueKey,
        *,
        messages: int,
        size: int | None,
        seen_version: int,
        now: float,
        settle: float,
    ) -> QueueDepth | None:
        """Adopt RabbitMQ's count when the gateway is quiet for the queue.

        ``seen_version`` is :meth:`version` read before the request was sent.
        ``size`` is RabbitMQ's byte count when it is trustworthy (None keeps
        ours; with no messages the size is 0 anyway).  Returns the depth when
        it was changed, else None.
        """
        depth = self.get(key)
        if depth.version != seen_version or now - depth.changed_at < settle:
            return None
        new_size = 0 if messages == 0 else (size if size is not None else depth.bytes)
        if messages == depth.messages and new_size == depth.bytes:
            return None
        if size is None and messages and depth.messages and messages != depth.messages:
            # Scale our bytes to the new count until RabbitMQ's byte stats catch up.
            new_size = depth.bytes * messages // depth.messages
        depth.messages = messages
        depth.bytes = new_size
        return depth


class Delivery(NamedTuple):
    """An unacknowledged delivery: which queue, how many body bytes."""

    queue: str
    size: int


class ChannelDeliveries:
    """Delivery tags of one channel awaiting acknowledgement.

    Delivery tags rise monotonically per channel, so insertion order is tag
    order and ``multiple`` acknowledgements release a prefix.
    """

    def __init__(self) -> None:
        self._pending: dict[int, Delivery] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def delivered(self, tag: int, queue: str, size: int) -> None:
        """Record a delivery that needs acknowledging."""
        self._pending[tag] = Delivery(queue, size)

    def settle(self, tag: int, multiple: bool) -> list[Delivery]:
        """Remove and return the deliveries an ack/reject/nack covers.

        ``tag`` 0 with ``multiple`` covers every outstanding delivery.
        Unknown tags (e.g. of a no-ack delivery) cover nothing.
        """
        if not multiple:
            one = self._pending.pop(tag, None)
            return [one] if one else []
        settled: list[Delivery] = []
        for pending_tag in list(self._pending):
            if tag and pending_tag > tag:
                break
            settled.append(self._pending.pop(pending_tag))
        return settled

    def requeue_all(self) -> None:
        """Channel closed or recovered: RabbitMQ requeues, depth is unchanged."""
        self._pending.clear()

    def queues(self) -> Iterable[str]:
        """Queues with outstanding deliveries on this channel."""
        return {d.queue for d in self._pending.values()}

    def count_by_queue(self, into: dict[str, int]) -> None:
        """Add this channel's outstanding deliveries per queue to ``into``.

        Walks the deliveries: only the depth poll of flowed queues asks,
        so the relay path keeps no running count.
        """
        for delivery in self._pending.values():
            into[delivery.queue] = into.get(delivery.queue, 0) + 1
