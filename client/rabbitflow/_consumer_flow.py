"""Open MQ consumer flow limits over AMQP credit, sans-IO.

Terms, per consumer:

* *buffered*: delivered by the broker and not yet processed by the
  application (not yet returned by ``receive()`` / not yet handed to the
  listener).  Never more than ``imqConsumerFlowLimit``.
* *credit*: deliveries the broker may still make (granted, not yet arrived).
* *held*: processed messages whose broker ack is deferred (AUTO/DUPS_OK
  sessions ack in batches when credit is granted; CLIENT_ACKNOWLEDGE and
  transacted sessions hold them until the application acknowledges/commits).

Each consumer has its own AMQP channel whose prefetch count (``basic.qos``
with ``global=true``, which RabbitMQ applies at once) is kept equal to
``buffered + held + credit``: the broker can then deliver exactly ``credit``
more.  Open MQ's batch rule: once a consumer's ``buffered + credit`` is down
to its threshold (``limit * imqConsumerFlowThreshold // 100``) it gets the
next batch, ``limit - buffered - credit`` credits (``limit - buffered`` when
its credit is used up, as it is on a busy queue).  An AUTO/DUPS_OK
consumer acks what it processed with its next batch; one that processed
everything delivered and whose credit then went unused for ``idle_after``
seconds (a quiet queue, not a batch merely late) acks it on a ``tick``.

``imqConnectionFlowLimit`` (when enabled) is ONE total for the connection,
shared by all its consumers, not a per-consumer share: the sum of ``buffered
+ credit`` over the consumers never exceeds it, and a consumer alone on a
busy queue may use all of it. A batch is cut to the room left in the pool,
and waits until the pool has room for at least ``limit - threshold`` (no
grants of one slot at a time). Consumers that used up their credit
("hungry") are served first, oldest grant first. A hungry consumer that
finds the pool short takes back credit another consumer has left unused for
``idle_after`` seconds (an idle queue): that consumer's prefetch is lowered,
or, with nothing left, its basic.consume is cancelled (``StopConsuming``).
Neither recalls deliveries the broker sent before it took effect, so the
credit taken back joins the pool only when the broker confirmed it: the
driver calls ``reclaim_confirmed`` on the qos-ok of a
``SetPrefetch(confirm=True)`` and on the cancel-ok of a ``StopConsuming``,
each of which follows every such delivery on the channel. Deliveries
arriving meanwhile use the credit up (a cancelled consumer's are rejected
back to the queue by the driver, unseen by the application). A stopped
consumer cannot show demand through deliveries, so every ``probe_interval``
seconds the driver asks the broker for its queue's depth (``ProbeQueue``); a
queue with messages makes it hungry again. Timers are the driver's: it calls
``tick(now)`` at ``wake_at()``.

``ConnectionFlow`` returns actions (``SetPrefetch``, ``Ack``, ``StartConsuming``,
``StopConsuming``, ``ProbeQueue``) that the caller carries out on the
consumer's channel in the given order.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

__all__ = [
    "Ack",
    "ConnectionFlow",
    "ConsumerFlowStats",
    "FlowAction",
    "ProbeQueue",
    "SetPrefetch",
    "StartConsuming",
    "StopConsuming",
]


@dataclass(frozen=True, slots=True)
class SetPrefetch:
    """Set the consumer channel's prefetch count (never 0: 0 means unlimited)."""

    consumer: int
    count: int
    #: Taking back credit: call ``ConnectionFlow.reclaim_confirmed`` on its qos-ok.
    confirm: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge every delivery up to ``tag`` (multiple=True) on the consumer's channel."""

    consumer: int
    tag: int


@dataclass(frozen=True, slots=True)
class StartConsuming:
    """Issue basic.consume: the consumer has credit (again)."""

    consumer: int


@dataclass(frozen=True, slots=True)
class StopConsuming:
    """Issue basic.cancel: the consumer's unused credit goes to another
    consumer; call ``ConnectionFlow.reclaim_confirmed`` on its cancel-ok."""

    consumer: int


@dataclass(frozen=True, slots=True)
class ProbeQueue:
    """Ask the broker how many messages the (stopped) consumer's queue holds,
    and report it with ``ConnectionFlow.queue_depth``."""

    consumer: int


FlowAction = SetPrefetch | Ack | StartConsuming | StopConsuming | ProbeQueue


@dataclass(frozen=True, slots=True)
class ConsumerFlowStats:
    """Counters of one consumer, for applications and tests."""

    delivered: int
    processed: int
    buffered: int
    max_buffered: int
    credit: int
    grants: tuple[int, ...]  # sizes of the last 1000 credit grants, oldest first


@dataclass(slots=True)
class _Consumer:
    limit: int
    threshold_pct: int
    app_acks: bool
    buffered: int = 0
    credit: int = 0
    held: int = 0
    last_tag: int = 0  # last processed delivery tag, for acks
    ack_pending: bool = False  # held messages whose ack is due (app acked / batch)
    consuming: bool = False
    started: bool = False  # consumed on this channel (held messages can be acked)
    prefetch_sent: int = 0  # last prefetch count asked of the broker (0: none yet)
    delivered: int = 0
    processed: int = 0
    max_buffered: int = 0
    grants: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=1000))
    # Connection-limit bookkeeping.
    hungry: bool = True  # used up its credit (or never had any): wants a batch
    grant_seq: int = 0  # order of its last grant (0: never granted)
    last_active: float = 0.0  # time of its last grant or delivery
    parked: bool = False  # its credit was taken back: basic.consume cancelled
    reclaiming: int = 0  # credit taken back, in the pool once the broker confirms it
    reclaims_pending: int = 0  # lowering basic.qos frames not yet confirmed
    probe_at: float = 0.0  # when to ask its queue's depth next (while parked)


def _drained(c: _Consumer) -> bool:
    """An AUTO/DUPS_OK consumer that processed everything delivered and holds acks."""
    return not c.app_acks and bool(c.held) and c.buffered == 0 and c.consuming


class ConnectionFlow:
    """Credit accounting for all consumers of one connection."""

    def __init__(
        self,
        connection_limit: int | None = None,
        *,
        idle_after: float = 0.25,
        probe_interval: float = 1.0,
    ) -> None:
        self.connection_limit = connection_limit
        self.idle_after = idle_after
        self.probe_interval = probe_interval
        self._consumers: dict[int, _Consumer] = {}
        self._grant_seq = itertools.count(1)
        self.active = False  # no credit is granted before the connection starts

    def activate(self, active: bool = True, *, now: float = 0.0) -> list[FlowAction]:
        """The connection started: grant first credits (stop does not revoke any)."""
        self.active = active
        return self._rebalance(now)

    def _limits(self, c: _Consumer) -> tuple[int, int]:
        """The consumer's effective (limit, threshold count): a connection limit
        below the consumer's own caps it (the pool is shared, not split)."""
        limit = c.limit
        if self.connection_limit is not None:
            limit = min(limit, self.connection_limit)
        return limit, limit * c.threshold_pct // 100

    # ---------------------------------------------------------------- queries
    @property
    def buffered(self) -> int:
        """Messages buffered for all consumers of the connection."""
        return sum(c.buffered for c in self._consumers.values())

    @property
    def outstanding(self) -> int:
        """Messages counted against the connection limit, over all consumers."""
        return sum(self._pool_use(c) for c in self._consumers.values())

    def stats(self, consumer: int) -> ConsumerFlowStats:
        """Counters of ``consumer``.

        Raises:
            KeyError: unknown consumer.
        """
        c = self._consumers[consumer]
        return ConsumerFlowStats(
            delivered=c.delivered,
            processed=c.processed,
            buffered=c.buffered,
            max_buffered=c.max_buffered,
            credit=c.credit,
            grants=tuple(c.grants),
        )

    def wake_at(self) -> float | None:
        """When the driver should call ``tick`` next (None: no timer needed)."""
        if not self.active:
            return None
        if self.connection_limit is None:
            idle = [
                c.last_active + self.idle_after for c in self._consumers.values() if _drained(c)
            ]
            return min(idle) if idle else None
        times = [c.probe_at for c in self._consumers.values() if c.parked and not c.hungry]
        if any(self._short(c) for c in self._consumers.values()):
            times += [
                c.last_active + self.idle_after
                for c in self._consumers.values()
                if c.credit > 0 and not c.hungry
            ]
        return min(times) if times else None

    # ---------------------------------------------------------------- events
    def register(
        self, consumer: int, *, limit: int, threshold_pct: int, app_acks: bool, now: float = 0.0
    ) -> list[FlowAction]:
        """Add a consumer; returns its first grant (and StartConsuming) if any.

        Raises:
            ValueError: duplicate id, limit below 1 or threshold outside 0..100.
        """
        if consumer in self._consumers:
            raise ValueError(f"consumer {consumer} already registered")
        if limit < 1 or not 0 <= threshold_pct <= 100:
            raise ValueError(f"bad limit {limit} / threshold {threshold_pct}")
        self._consumers[consumer] = _Consumer(limit, threshold_pct, app_acks, last_active=now)
        return self._rebalance(now)

    def unregister(self, consumer: int, *, now: float = 0.0) -> list[FlowAction]:
        """Remove a consumer (closing); its credit returns to the pool.

        An AUTO/DUPS_OK consumer first acks what it processed, so closing its
        channel requeues only messages the application never saw.
        """
        c = self._consumers.pop(consumer, None)
        actions: list[FlowAction] = []
        if c is not None and not c.app_acks and c.held and c.started:
            actions.append(Ack(consumer, c.last_tag))
        return actions + self._rebalance(now)

    def reset(self, consumer: int, *, now: float = 0.0) -> list[FlowAction]:
        """The consumer's channel was re-opened (reconnection): the broker will
        redeliver everything that was unacked, so start from nothing."""
        c = self._consumers[consumer]
        c.buffered = c.credit = c.held = 0
        c.last_tag = 0
        c.ack_pending = False
        c.consuming = c.started = False
        c.prefetch_sent = 0
        c.hungry, c.parked, c.last_active = True, False, now
        c.reclaiming = c.reclaims_pending = 0
        return self._rebalance(now)

    def delivered(self, consumer: int, *, now: float = 0.0) -> None:
        """A message arrived for ``consumer`` (it uses one credit)."""
        c = self._consumers[consumer]
        if c.credit:
            c.credit -= 1
        elif c.reclaiming:  # sent before the lower prefetch took effect
            c.reclaiming -= 1
        c.buffered += 1
        c.delivered += 1
        c.max_buffered = max(c.max_buffered, c.buffered)
        c.last_active = now
        if c.credit == 0:
            c.hungry = True

    def processed(self, consumer: int, tag: int, *, now: float = 0.0) -> list[FlowAction]:
        """The application is done with delivery ``tag`` (receive() returned it,
        or the listener returned)."""
        c = self._consumers[consumer]
        c.buffered = max(c.buffered - 1, 0)
        c.held += 1
        c.processed += 1
        c.last_tag = max(c.last_tag, tag)
        if not c.app_acks:
            c.ack_pending = True
        return self._rebalance(now)

    def acknowledged(self, consumer: int, *, now: float = 0.0) -> list[FlowAction]:
        """The application acknowledged (CLIENT_ACKNOWLEDGE) or committed: ack
        everything processed so far."""
        c = self._consumers[consumer]
        if c.held:
            c.ack_pending = True
        return self._rebalance(now) + self._flush_ack(consumer, c)

    def tick(self, now: float) -> list[FlowAction]:
        """Timers (see ``wake_at``): probe stopped consumers' queues, take back
        credit left unused, grant what is due."""
        actions: list[FlowAction] = []
        for cid, c in self._consumers.items():
            if c.parked and not c.hungry and c.probe_at <= now:
                c.probe_at = now + self.probe_interval
                actions.append(ProbeQueue(cid))
        return actions + self._rebalance(now)

    def reclaim_confirmed(self, consumer: int, *, now: float) -> list[FlowAction]:
        """The broker confirmed a ``SetPrefetch(confirm=True)`` (qos-ok) or a
        ``StopConsuming`` (cancel-ok): every delivery sent before it has
        arrived, so once none is pending the credit taken back is the pool's."""
        c = self._consumers.get(consumer)
        if c is None or not c.reclaims_pending:
            return []
        c.reclaims_pending -= 1
        if c.reclaims_pending:
            return []
        c.reclaiming = 0
        return self._rebalance(now)

    def queue_depth(self, consumer: int, depth: int, *, now: float) -> list[FlowAction]:
        """The answer to ``ProbeQueue``: a stopped consumer whose queue holds
        messages wants a batch again."""
        c = self._consumers.get(consumer)
        if c is None or not c.parked or depth <= 0:
            return []
        c.hungry = True
        return self._rebalance(now)

    # --------------------------------------------------------------- internal
    def _prefetch(self, c: _Consumer) -> int:
        return c.buffered + (0 if c.ack_pending else c.held) + c.credit

    def _flush_ack(self, cid: int, c: _Consumer) -> list[FlowAction]:
        """Ack held messages if the prefetch stays >= 1 after it (0 = unlimited)."""
        if not c.ack_pending or not c.held or not c.started:
            return []
        if not c.consuming:
            # Stopped: no deliveries can follow, the prefetch does not matter.
            c.held = 0
            c.ack_pending = False
            return [Ack(cid, c.last_tag)]
        count = self._prefetch(c)
        if count < 1:
            return []  # starved by the connection pool: ack with the next grant
        c.held = 0
        c.ack_pending = False
        # A lower prefetch must reach the broker before the ack frees room.
        return [*self._set_prefetch(cid, c), Ack(cid, c.last_tag)]

    def _set_prefetch(self, cid: int, c: _Consumer, *, confirm: bool = False) -> list[FlowAction]:
        """SetPrefetch if the count changed: with a constant prefetch (no
        connection limit, AUTO/DUPS_OK) refills are driven by acks alone."""
        count = self._prefetch(c)
        if count < 1 or count == c.prefetch_sent:
            return []
        c.prefetch_sent = count
        return [SetPrefetch(cid, count, confirm)]

    @staticmethod
    def _pool_use(c: _Consumer) -> int:
        # Held messages of AUTO/DUPS_OK consumers are acks we chose to defer,
        # so they still count against the connection pool; CLIENT_ACKNOWLEDGE
        # ones are the application's to acknowledge and do not.
        return c.buffered + c.credit + c.reclaiming + (0 if c.app_acks else c.held)

    def _short(self, c: _Consumer) -> bool:
        """Hungry and due a batch (its buffer is down to the threshold)."""
        _, threshold = self._limits(c)
        return c.hungry and c.buffered + c.credit <= threshold

    def _reclaim(self, taker: int, need: int, now: float) -> tuple[int, list[FlowAction]]:
        """Take back up to ``need`` credits that other consumers left unused for
        ``idle_after`` seconds; returns how many are free at once (a lowered
        prefetch frees its credit when the broker confirms it), and the
        actions that do it."""
        taken = 0
        actions: list[FlowAction] = []
        for cid, c in self._consumers.items():
            if taken >= need:
                break
            if cid == taker or c.hungry or c.credit == 0:
                continue
            if now - c.last_active < self.idle_after:
                continue
            take = min(c.credit, need - taken)
            c.credit -= take
            if c.buffered + c.credit == 0 and c.consuming:
                # Deliveries still on their way to the cancelled consumer go
                # back to the queue (the driver rejects them); until the
                # cancel-ok says none is left, the credit is not free.
                c.consuming = False
                c.parked = True
                c.probe_at = now + self.probe_interval
                c.prefetch_sent = 0
                c.reclaiming += take
                c.reclaims_pending += 1
                actions.append(StopConsuming(cid))
                actions += self._flush_ack(cid, c)
                continue
            lower = self._set_prefetch(cid, c, confirm=True)
            if lower:
                c.reclaiming += take
                c.reclaims_pending += 1
                actions += lower
            else:
                taken += take
        return taken, actions

    def _order(self) -> list[tuple[int, _Consumer]]:
        items = list(self._consumers.items())
        if self.connection_limit is not None:
            # Consumers that used up their credit first, the longest-waiting first.
            items.sort(key=lambda kv: (not kv[1].hungry, kv[1].grant_seq))
        return items

    def _rebalance(self, now: float) -> list[FlowAction]:
        actions: list[FlowAction] = []
        if not self.active:
            return actions
        limited = self.connection_limit is not None
        if limited:
            # Deferred acks hold pool room: send them at once.
            for cid, c in self._consumers.items():
                if c.ack_pending and c.held:
                    actions += self._flush_ack(cid, c)
        total = sum(self._pool_use(c) for c in self._consumers.values())
        for cid, c in self._order():
            before = self._pool_use(c)
            converted = 0
            # (Under a connection limit acks were sent above; one still held is
            # a consumer starved by the pool, acked with its next grant.)
            if not limited and _drained(c) and now - c.last_active >= self.idle_after:
                # Idle: everything delivered is processed and the credit went
                # unused for idle_after.  Ack now rather than at the next
                # batch, which may never come on a quiet queue: unacked
                # messages count in the queue's depth (and so in flow control)
                # and would be redelivered if the channel closed.  Not sooner:
                # a batch merely late (a busy broker) would be topped up one
                # message at a time.  The prefetch stays, so the acked slots
                # become credit.
                converted = c.held
                c.credit += c.held
                actions += self._flush_ack(cid, c)
            grant = self._batch(cid, c, total - before, now, actions)
            if grant is None:  # not due: more than the threshold outstanding
                pass
            elif grant > 0:
                c.credit += grant
                c.grant_seq = next(self._grant_seq)
                c.last_active = now
                c.parked = False
                if c.ack_pending and c.held:
                    actions += self._flush_ack(cid, c)
                else:
                    actions += self._set_prefetch(cid, c)
                if not c.consuming:
                    c.consuming = c.started = True
                    actions.append(StartConsuming(cid))
            elif c.ack_pending and c.held:
                actions += self._flush_ack(cid, c)
            if (grant or 0) + converted > 0:
                c.grants.append((grant or 0) + converted)
            total += self._pool_use(c) - before
        return actions

    def _batch(
        self, cid: int, c: _Consumer, others: int, now: float, actions: list[FlowAction]
    ) -> int | None:
        """The grant due to ``c`` now (None: not due; 0: due but no room);
        ``others`` is the pool room the other consumers use.  Appends reclaim
        actions to ``actions``."""
        limit, threshold = self._limits(c)
        outstanding = c.buffered + c.credit
        if outstanding > threshold:
            return None
        wanted = limit - outstanding
        if self.connection_limit is None:
            return wanted
        assert self.connection_limit is not None
        available = self.connection_limit - others - outstanding - c.reclaiming
        if available < wanted and c.hungry:
            taken, reclaimed = self._reclaim(cid, wanted - available, now)
            actions += reclaimed
            available += taken
        if available < min(wanted, max(limit - threshold, 1)):
            # Wait for room for a whole batch rather than nibble at each slot
            # another consumer frees (one qos frame per message).
            return 0
        grant = max(min(wanted, available), 0)
        if grant:
            c.hungry = False  # hungry again once deliveries use the credit up
        return grant
