"""Which RabbitMQ count of a queue's depth is true, per queue type (pure).

The gateway counts depth from the traffic it relays and reconciles it with
RabbitMQ's own counts (:meth:`~rabbitflow_broker.engine.depth.DepthTracker.reconcile`).
Not every count RabbitMQ gives is true for every queue type, and adopting a
false one is worse than adopting none: a quorum queue that reads as empty
while it holds 150 messages lets its producers go on past every bound.

Three sources, two of them from the management API, polled for every queue:

* **totals** (``/api/queues?disable_stats=true&enable_queue_totals=true``):
  for a classic queue ``messages`` (ready + unacknowledged) and its parts
  are current to milliseconds.  For a quorum queue or a stream it is a copy
  of the statistics, ``0`` (in the list) or null (one queue) until the first
  statistics event after the queue was created: never adopted.
* **statistics** (``/api/queues?columns=…``): ``messages``,
  ``message_bytes`` and their ready/unacknowledged parts for every queue
  type, emitted by each queue every ``collect_statistics_interval`` (5 s by
  default), so up to that old; a new quorum queue first reports 0.  Adopted
  for quorum queues and streams only once the gateway has changed nothing
  for the queue for :data:`STATS_SETTLE_S` (two statistics intervals and a
  margin), so a count the statistics have not caught up with yet is never
  taken.

and one polled only for the queues that are flowed or near their stop
threshold, often (:meth:`DepthSources.declared`):

* **passive declare**: ``queue.declare(passive=True)`` on the gateway's own
  connection returns the queue's *ready* count straight from the queue (a
  quorum queue's leader), current.  Depth is ready + unacknowledged, and
  the unacknowledged part is taken from the last listing above (totals for
  a classic queue, statistics for a quorum queue), under three conditions
  that keep a stale part from making the queue look emptier than it is:

  - no client of the gateway held unacknowledged deliveries of the queue
    since that listing was taken (:meth:`DepthSources.gateway_unacked`);
  - while the queue has consumers, the listing's ready count equals the
    current one, so no delivery can have moved messages from ready to
    unacknowledged since (without consumers, a falling ready count is a
    ``basic.get``, a purge, expiry or dead-lettering);
  - a quorum queue not yet in the statistics (the first 5 s of its life)
    counts no unacknowledged messages only while it has no consumer;
  - a quorum queue's ``0`` ready with ``0`` consumers is taken only when it
    came back faster than RabbitMQ's own 250 ms query timeout, twice in a
    row: RabbitMQ answers a passive declare whose leader query timed out
    or failed with exactly that.

:class:`DepthSources` turns each poll into the :class:`Reading` values the
gateway may reconcile with; it keeps the last count seen per queue, since a
listing's count is adopted only when RabbitMQ reported it twice in a row
while the gateway changed nothing (a publish still in flight upstream
cannot look like bypass traffic then).  This is the one narrow interface
between the depth accounting and where counts come from: I/O (the
management API, the passive declares) stays in the service.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DECLARE_SETTLE_S",
    "QUORUM_STAT_TIMEOUT_S",
    "STATS_SETTLE_S",
    "DepthSources",
    "QueueType",
    "Reading",
    "queue_type",
]

QueueKey = tuple[str, str]

#: How long the gateway must have left a queue alone before a count from the
#: statistics (up to one 5 s statistics interval old) is adopted for it.
STATS_SETTLE_S: Final = 12.0
#: How long the gateway must have left a queue alone before a passive
#: declare's count is adopted: a publish it relayed has reached the queue.
DECLARE_SETTLE_S: Final = 0.25
#: RabbitMQ's timeout for the leader query behind a quorum queue's passive
#: declare; a timed-out query answers 0 ready, 0 consumers.
QUORUM_STAT_TIMEOUT_S: Final = 0.25


class QueueType(enum.Enum):
    """RabbitMQ's queue types (``x-queue-type``)."""

    CLASSIC = "classic"
    QUORUM = "quorum"
    STREAM = "stream"


def queue_type(arguments: Mapping[str, object] | None, listed: object = None) -> QueueType:
    """The queue's type from the management listing's ``type``, else its arguments.

    Anything unknown counts as classic (RabbitMQ's default type).
    """
    value: object = listed
    if not isinstance(value, str) or not value:
        value = (arguments or {}).get("x-queue-type")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        return QueueType(value)
    except ValueError:
        return QueueType.CLASSIC


@dataclass(frozen=True, slots=True)
class Reading:
    """A count the gateway may adopt for a queue it left alone for ``settle`` seconds.

    ``size`` is None when the source gives no trustworthy byte count.
    """

    messages: int
    size: int | None
    settle: float
    source: str


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


@dataclass(frozen=True, slots=True)
class _Listed:
    """What the last management listing said of a queue."""

    kind: QueueType
    ready: int | None
    unacked: int | None


class DepthSources:
    """Chooses, per queue type, which of RabbitMQ's counts are true.

    ``interval`` is the reconciliation period in seconds: a current count
    (classic totals) is adopted for a queue the gateway left alone that long.
    """

    def __init__(self, *, interval: float, stats_settle: float = STATS_SETTLE_S) -> None:
        self.interval = interval
        self.stats_settle = stats_settle
        self._last: dict[QueueKey, tuple[str, int, int]] = {}
        self._listed: dict[QueueKey, _Listed] = {}
        # Until when a listing may count deliveries a gateway client holds.
        self._tainted: dict[QueueKey, float] = {}
        self._empty_once: set[QueueKey] = set()

    def readings(
        self,
        key: QueueKey,
        kind: QueueType,
        *,
        totals: object,
        stats: tuple[object, object] | None,
        seen_version: int,
        initial: bool = False,
        totals_parts: tuple[object, object] = (None, None),
        stats_parts: tuple[object, object] = (None, None),
    ) -> list[Reading]:
        """What to reconcile ``key`` with, from one poll; empty when nothing is adoptable.

        ``totals`` is ``messages`` of the totals listing; ``stats`` is
        (``messages``, ``message_bytes``) of the statistics listing, or None
        when it did not list the queue.  ``totals_parts`` and ``stats_parts``
        are (``messages_ready``, ``messages_unacknowledged``) of each, kept
        for :meth:`declared`.  ``seen_version`` is the gateway's depth
        version of the queue read before the poll.  ``initial`` (the first
        poll at start-up) adopts without waiting for a second report.
        """
        stats_messages, stats_size = stats if stats is not None else (None, None)
        stats_count, stats_bytes = _count(stats_messages), _count(stats_size)
        parts = totals_parts if kind is QueueType.CLASSIC else stats_parts
        self._listed[key] = _Listed(kind, _count(parts[0]), _count(parts[1]))
        if kind is QueueType.CLASSIC:
            count = _count(totals)
            if count is None or not self._twice(key, "totals", count, seen_version, initial):
                return []
            found = [Reading(count, None, self.interval, "totals")]
            if stats_count == count and stats_bytes is not None:
                # Bytes only from the statistics, seconds old: only for a quiet queue.
                found.append(Reading(count, stats_bytes, self.stats_settle, "statistics"))
            return found
        # Quorum queues and streams: the totals listing's count is not theirs.
        if stats_count is None or stats_bytes is None:
            self._last.pop(key, None)
            return []
        if not self._twice(key, "statistics", stats_count, seen_version, initial):
            return []
        return [Reading(stats_count, stats_bytes, self.stats_settle, "statistics")]

    def _twice(self, key: QueueKey, source: str, count: int, version: int, initial: bool) -> bool:
        previous = self._last.get(key)
        self._last[key] = (source, count, version)
        return initial or previous == (source, count, version)

    def keep_only(self, keys: Iterable[QueueKey]) -> None:
        """Forget the last counts of queues no longer listed."""
        listed = set(keys)
        for table in (self._last, self._listed, self._tainted):
            for key in list(table):
                if key not in listed:
                    del table[key]
        self._empty_once &= listed

    def gateway_unacked(self, counts: Mapping[QueueKey, int], now: float) -> None:
        """Clients of the gateway hold ``counts`` unacknowledged deliveries
        per queue at ``now``: the listings until they are surely newer
        count them as unacknowledged too, so :meth:`declared` leaves those
        queues to the gateway's own count meanwhile."""
        for key, count in counts.items():
            if count > 0:
                listed = self._listed.get(key)
                quorum = listed is not None and listed.kind is not QueueType.CLASSIC
                window = self.stats_settle if quorum else 2 * self.interval + DECLARE_SETTLE_S
                self._tainted[key] = now + window

    def declared(
        self, key: QueueKey, *, ready: int, consumers: int, elapsed: float, now: float
    ) -> Reading | None:
        """A reading from a passive declare's ``ready`` count, or None.

        ``consumers`` is the declare's consumer count, ``elapsed`` how long
        its answer took.  Depth is ``ready`` plus the unacknowledged count
        of the last listing, when that part cannot be stale (see the module
        docstring); the byte count is left to the gateway.
        """
        listed = self._listed.get(key)
        if listed is None or listed.kind is QueueType.STREAM:
            return None
        if now < self._tainted.get(key, float("-inf")):
            return None
        unacked = listed.unacked
        if unacked is None:
            # A quorum queue younger than its first statistics event: with
            # no consumer, only a basic.get could hold a message unacked.
            if consumers or listed.kind is QueueType.CLASSIC:
                return None
            unacked = 0
        if consumers and listed.ready != ready:
            return None
        if listed.kind is QueueType.QUORUM and not ready and not consumers:
            if elapsed >= QUORUM_STAT_TIMEOUT_S:
                self._empty_once.discard(key)
                return None
            if key not in self._empty_once:
                self._empty_once.add(key)
                return None
        else:
            self._empty_once.discard(key)
        return Reading(ready + unacked, None, DECLARE_SETTLE_S, "declare")
