"""Which RabbitMQ count of a queue's depth is true, per queue type (pure).

The gateway counts depth from the traffic it relays and reconciles it with
RabbitMQ's own counts (:meth:`~rabbitflow_broker.depth.DepthTracker.reconcile`).
Not every count RabbitMQ gives is true for every queue type, and adopting a
false one is worse than adopting none: a quorum queue that reads as empty
while it holds 150 messages lets its producers go on past every bound.

RabbitMQ 3.10's management API has two listings:

* **totals** (``/api/queues?disable_stats=true&enable_queue_totals=true``):
  for a classic queue ``messages`` (ready + unacknowledged) is current to
  milliseconds.  For a quorum queue or a stream it is a copy of the
  statistics, ``0`` (in the list) or null (one queue) until the first
  statistics event after the queue was created: never adopted.
* **statistics** (``/api/queues?columns=…,messages,message_bytes``):
  ``messages`` and ``message_bytes`` of every queue type, emitted by each
  queue every ``collect_statistics_interval`` (5 s by default), so up to
  that old; a new quorum queue first reports 0.  Adopted for quorum queues
  and streams only once the gateway has changed nothing for the queue for
  :data:`STATS_SETTLE_S` (two statistics intervals and a margin), so a
  count the statistics have not caught up with yet is never taken.

:class:`DepthSources` turns one poll of both listings into the
:class:`Reading` values the gateway may reconcile with; it also keeps the
last count seen per queue, since a count is adopted only when RabbitMQ
reported it twice in a row while the gateway changed nothing (a publish
still in flight upstream cannot look like bypass traffic then).  This is
the one narrow interface between the depth accounting and where counts
come from: I/O (the management API) stays in the service.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["STATS_SETTLE_S", "DepthSources", "QueueType", "Reading", "queue_type"]

QueueKey = tuple[str, str]

#: How long the gateway must have left a queue alone before a count from the
#: statistics (up to one 5 s statistics interval old) is adopted for it.
STATS_SETTLE_S: Final = 12.0


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


class DepthSources:
    """Chooses, per queue type, which of RabbitMQ's counts are true.

    ``interval`` is the reconciliation period in seconds: a current count
    (classic totals) is adopted for a queue the gateway left alone that long.
    """

    def __init__(self, *, interval: float, stats_settle: float = STATS_SETTLE_S) -> None:
        self.interval = interval
        self.stats_settle = stats_settle
        self._last: dict[QueueKey, tuple[str, int, int]] = {}

    def readings(
        self,
        key: QueueKey,
        kind: QueueType,
        *,
        totals: object,
        stats: tuple[object, object] | None,
        seen_version: int,
        initial: bool = False,
    ) -> list[Reading]:
        """What to reconcile ``key`` with, from one poll; empty when nothing is adoptable.

        ``totals`` is ``messages`` of the totals listing; ``stats`` is
        (``messages``, ``message_bytes``) of the statistics listing, or None
        when it did not list the queue.  ``seen_version`` is the gateway's
        depth version of the queue read before the poll.  ``initial`` (the
        first poll at start-up) adopts without waiting for a second report.
        """
        stats_messages, stats_size = stats if stats is not None else (None, None)
        stats_count, stats_bytes = _count(stats_messages), _count(stats_size)
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
        for key in list(self._last):
            if key not in listed:
                del self._last[key]
