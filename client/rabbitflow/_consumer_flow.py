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
more.  A consumer gets a batch of ``limit - buffered - credit`` credits once
``buffered + credit`` is down to the threshold (``limit * threshold // 100``),
so refills come in batches of at least ``limit - threshold`` messages.  With
``imqConnectionFlowLimitEnabled`` every grant also draws on one pool per
connection, so the sum of ``buffered + credit`` over the connection's
consumers never exceeds ``imqConnectionFlowLimit``.

``ConnectionFlow`` returns actions (``SetPrefetch``, ``Ack``, ``StartConsuming``)
that the caller carries out on the consumer's channel in the given order.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

__all__ = [
    "Ack",
    "ConnectionFlow",
    "ConsumerFlowStats",
    "FlowAction",
    "SetPrefetch",
    "StartConsuming",
]


@dataclass(frozen=True, slots=True)
class SetPrefetch:
    """Set the consumer channel's prefetch count (never 0: 0 means unlimited)."""

    consumer: int
    count: int


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge every delivery up to ``tag`` (multiple=True) on the consumer's channel."""

    consumer: int
    tag: int


@dataclass(frozen=True, slots=True)
class StartConsuming:
    """Issue basic.consume: the consumer has its first credit."""

    consumer: int


FlowAction = SetPrefetch | Ack | StartConsuming


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
    prefetch_sent: int = 0  # last prefetch count asked of the broker (0: none yet)
    delivered: int = 0
    processed: int = 0
    max_buffered: int = 0
    grants: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=1000))


class ConnectionFlow:
    """Credit accounting for all consumers of one connection."""

    def __init__(self, connection_limit: int | None = None) -> None:
        self.connection_limit = connection_limit
        self._consumers: dict[int, _Consumer] = {}
        self.active = False  # no credit is granted before the connection starts

    def activate(self, active: bool = True) -> list[FlowAction]:
        """The connection started: grant first credits (stop does not revoke any)."""
        self.active = active
        return self._rebalance()

    def _limits(self, c: _Consumer) -> tuple[int, int]:
        """The consumer's effective (limit, threshold count): with a connection
        limit, each consumer's limit is capped at an even share of it, so one
        busy (or idle but credited) consumer cannot starve the others."""
        limit = c.limit
        if self.connection_limit is not None and self._consumers:
            limit = min(limit, max(1, self.connection_limit // len(self._consumers)))
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

    # ---------------------------------------------------------------- events
    def register(
        self, consumer: int, *, limit: int, threshold_pct: int, app_acks: bool
    ) -> list[FlowAction]:
        """Add a consumer; returns its first grant (and StartConsuming) if any.

        Raises:
            ValueError: duplicate id, limit below 1 or threshold outside 0..100.
        """
        if consumer in self._consumers:
            raise ValueError(f"consumer {consumer} already registered")
        if limit < 1 or not 0 <= threshold_pct <= 100:
            raise ValueError(f"bad limit {limit} / threshold {threshold_pct}")
        self._consumers[consumer] = _Consumer(limit, threshold_pct, app_acks)
        return self._rebalance()

    def unregister(self, consumer: int) -> list[FlowAction]:
        """Remove a consumer (closing); its share of the pool goes to the others.

        An AUTO/DUPS_OK consumer first acks what it processed, so closing its
        channel requeues only messages the application never saw.
        """
        c = self._consumers.pop(consumer, None)
        actions: list[FlowAction] = []
        if c is not None and not c.app_acks and c.held and c.consuming:
            actions.append(Ack(consumer, c.last_tag))
        return actions + self._rebalance()

    def reset(self, consumer: int) -> list[FlowAction]:
        """The consumer's channel was re-opened (reconnection): the broker will
        redeliver everything that was unacked, so start from nothing."""
        c = self._consumers[consumer]
        c.buffered = c.credit = c.held = 0
        c.last_tag = 0
        c.ack_pending = False
        c.consuming = False
        c.prefetch_sent = 0
        return self._rebalance()

    def delivered(self, consumer: int) -> None:
        """A message arrived for ``consumer`` (it uses one credit)."""
        c = self._consumers[consumer]
        c.credit = max(c.credit - 1, 0)
        c.buffered += 1
        c.delivered += 1
        c.max_buffered = max(c.max_buffered, c.buffered)

    def processed(self, consumer: int, tag: int) -> list[FlowAction]:
        """The application is done with delivery ``tag`` (receive() returned it,
        or the listener returned)."""
        c = self._consumers[consumer]
        c.buffered = max(c.buffered - 1, 0)
        c.held += 1
        c.processed += 1
        c.last_tag = max(c.last_tag, tag)
        if not c.app_acks:
            c.ack_pending = True
        return self._rebalance()

    def acknowledged(self, consumer: int) -> list[FlowAction]:
        """The application acknowledged (CLIENT_ACKNOWLEDGE) or committed: ack
        everything processed so far."""
        c = self._consumers[consumer]
        if c.held:
            c.ack_pending = True
        return self._rebalance() + self._flush_ack(consumer, c)

    # --------------------------------------------------------------- internal
    def _prefetch(self, c: _Consumer) -> int:
        return c.buffered + (0 if c.ack_pending else c.held) + c.credit

    def _flush_ack(self, cid: int, c: _Consumer) -> list[FlowAction]:
        """Ack held messages if the prefetch stays >= 1 after it (0 = unlimited)."""
        if not c.ack_pending or not c.held or not c.consuming:
            return []
        count = self._prefetch(c)
        if count < 1:
            return []  # starved by the connection pool: ack with the next grant
        c.held = 0
        c.ack_pending = False
        # A lower prefetch must reach the broker before the ack frees room.
        return [*self._set_prefetch(cid, c), Ack(cid, c.last_tag)]

    def _set_prefetch(self, cid: int, c: _Consumer) -> list[FlowAction]:
        """SetPrefetch if the count changed: with a constant prefetch (no
        connection limit, AUTO/DUPS_OK) refills are driven by acks alone."""
        count = self._prefetch(c)
        if count < 1 or count == c.prefetch_sent:
            return []
        c.prefetch_sent = count
        return [SetPrefetch(cid, count)]

    def _trim_to_shares(self) -> list[FlowAction]:
        """Under a connection limit: ack deferred messages at once (they hold
        pool room) and take back unused credit above a consumer's share (its
        queue may be idle), so consumers that joined later are not starved."""
        actions: list[FlowAction] = []
        for cid, c in self._consumers.items():
            limit, _ = self._limits(c)
            excess = c.buffered + c.credit - limit
            if excess > 0 and c.credit > 0:
                c.credit -= min(excess, c.credit)
                actions += self._set_prefetch(cid, c)
            if c.ack_pending and c.held:
                actions += self._flush_ack(cid, c)
        return actions

    @staticmethod
    def _pool_use(c: _Consumer) -> int:
        # Held messages of AUTO/DUPS_OK consumers are acks we chose to defer,
        # so they still count against the connection pool; CLIENT_ACKNOWLEDGE
        # ones are the application's to acknowledge and do not.
        return c.buffered + c.credit + (0 if c.app_acks else c.held)

    def _rebalance(self) -> list[FlowAction]:
        actions: list[FlowAction] = []
        if not self.active:
            return actions
        if self.connection_limit is not None:
            actions += self._trim_to_shares()
        total = sum(self._pool_use(c) for c in self._consumers.values())
        for cid, c in self._consumers.items():
            limit, threshold = self._limits(c)
            if not c.app_acks and c.held and c.buffered == 0 and c.consuming:
                # Idle: everything delivered is processed.  Ack now rather than
                # at the next batch, which may never come on a quiet queue:
                # unacked messages count in the queue's depth (and so in flow
                # control) and would be redelivered if the channel closed.
                # The prefetch stays, so the acked slots become credit.
                c.credit += c.held
                c.grants.append(c.held)
                actions += self._flush_ack(cid, c)
            outstanding = c.buffered + c.credit
            if outstanding > threshold:
                continue
            grant = limit - outstanding
            if self.connection_limit is not None:
                # Acking our own deferred messages with this grant frees them.
                available = self.connection_limit - (total - self._pool_use(c)) - outstanding
                grant = max(min(grant, available), 0)
            before = self._pool_use(c)
            if grant > 0:
                c.credit += grant
                c.grants.append(grant)
                if c.ack_pending and c.held:
                    actions += self._flush_ack(cid, c)
                else:
                    actions += self._set_prefetch(cid, c)
                if not c.consuming:
                    c.consuming = True
                    actions.append(StartConsuming(cid))
            elif c.ack_pending and c.held:
                actions += self._flush_ack(cid, c)
            total += self._pool_use(c) - before
        return actions
