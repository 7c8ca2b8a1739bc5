"""A cluster member's books: its allowances, and the grant ledgers it keeps
while it owns the accounting (pure; the caller passes ``now``).

:class:`MemberBook` is what the hub consults on every publish routed to a
queue: :meth:`MemberBook.spend` spends one message of allowance, or, when
there is none, counts a *debt* and puts the queue in :attr:`MemberBook.held`:
the completions (confirms) of publishes routed there are held until a grant
pays the debt.  A queue held for longer than :data:`FLOW_AFTER_S` joins
:attr:`MemberBook.flowed` and its publishers' channels are flowed as for an
overfull queue; a short wait for a grant only delays confirms.  A queue the
owner declares ungoverned (no thresholds) needs no allowance for
:data:`FREE_FOR_S`, after which the member asks again (thresholds may have
been set meanwhile; a change made through the admin API is broadcast at
once).

:class:`OwnerBook` is the owner's side: a grant ledger per queue
(:class:`~rabbitflow_broker.engine.cluster.QueueOwner`, ledger part only: the
depth and the flow decision are the hub's, which counts every member's
reported use as a publish) and the members it heard from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from rabbitflow_broker.engine.cluster import (
    Flow,
    FlowUpdate,
    Grant,
    MemberAllowance,
    QueueOwner,
    Report,
    Request,
)
from rabbitflow_broker.engine.depth import QueueDepth

__all__ = [
    "FLOW_AFTER_S",
    "FREE_FOR_S",
    "GoneQueues",
    "MemberBook",
    "Missing",
    "OwnerBook",
    "QueueKey",
]

QueueKey = tuple[str, str]

#: A queue held this long for want of allowance flows its publishers' channels.
FLOW_AFTER_S: Final = 0.25
#: How long the owner's "no thresholds" answer is trusted before asking again.
FREE_FOR_S: Final = 5.0
#: :meth:`MemberBook.spend`: a queue's completions started being held.
NEW_HOLD: Final = 1
#: :meth:`MemberBook.spend`: a request is due (half a grant used).
DUE: Final = 2
#: :meth:`MemberBook.spend`: this publish's completion is held.
HELD: Final = 4
#: Removals are reported at least this often when nothing else goes out.
REPORT_EVERY_S: Final = 0.25
#: Publishes prepaid to a queue without thresholds (its time limit is what counts).
_FREE_PREPAID: Final = 1 << 40


@dataclass(slots=True)
class _Queue:
    allowance: MemberAllowance
    free_until: float = float("-inf")
    debt: int = 0
    debt_bytes: int = 0
    held_since: float | None = None
    last_report: float = float("-inf")
    last_publish: float = float("-inf")
    #: The hub's depth entry of the queue while publishes are prepaid there
    #: (see :meth:`MemberBook.spend`), and how many were prepaid.
    prepaid_in: QueueDepth | None = None
    prepaid: int = 0


def _prepay(entry: _Queue, depth: QueueDepth, amount: int, until: float) -> None:
    """Let the hub complete ``amount`` publishes to the queue until ``until``
    without asking (settled by :meth:`MemberBook._settle`)."""
    depth.prepaid = amount
    depth.prepaid_bytes = 0
    depth.prepaid_until = until
    entry.prepaid_in = depth
    entry.prepaid = amount


@dataclass(slots=True)
class MemberBook:
    """One member's allowances for every queue it has published to."""

    member: str
    batch: int
    lease: float
    queues: dict[QueueKey, _Queue] = field(default_factory=dict)
    #: Queues whose completions are held for want of allowance.
    held: set[QueueKey] = field(default_factory=set)
    #: Held for longer than FLOW_AFTER_S: their channels are flowed too.
    flowed: set[QueueKey] = field(default_factory=set)
    #: The highest owner epoch seen.
    epoch: int = 0
    #: Set when some queue used half a batch since its last request.
    due: bool = False

    def _queue(self, key: QueueKey) -> _Queue:
        entry = self.queues.get(key)
        if entry is None:
            allowance = MemberAllowance(self.member, _name(key), self.batch, self.lease)
            entry = self.queues[key] = _Queue(allowance)
        return entry

    def spend(self, key: QueueKey, size: int, now: float, depth: QueueDepth | None = None) -> int:
        """A publish routed to ``key`` (the hub's per-publish call, once per
        queue of the route): :data:`HELD` when its completion must wait,
        with :data:`NEW_HOLD` when the queue's completions started being held
        by it; :data:`DUE` while a request is due; 0 when it may complete and
        nothing needs saying.

        Given the hub's ``depth`` entry of the queue, a publish that may
        complete also prepays the next ones there: the allowance up to one
        short of the point at which it asks, set aside from one grant and
        valid as long as that grant (or, for a queue without thresholds, as
        long as that answer).  The hub spends those without calling here;
        what it spent is settled at the next call for the queue, at each
        round (:meth:`requests`, :meth:`busy`) and before any change of the
        queue's flow, and what it did not spend goes back to the grant.
        """
        entry = self.queues.get(key)
        if entry is None:
            entry = self._queue(key)
        if entry.prepaid_in is not None:
            self._settle(entry, now)
        entry.last_publish = now
        if now < entry.free_until:
            if depth is not None:
                _prepay(entry, depth, _FREE_PREPAID, entry.free_until)
            return DUE if self.due else 0
        if not entry.debt:
            allowance = entry.allowance
            if allowance.take(now, size):
                if allowance.left * 2 == allowance.ask_mark:
                    # Half the last grant left (the point at which the allowance
                    # asks): ask now, not at the next round, so that the grant
                    # arrives before the allowance ends.
                    self.due = True
                elif depth is not None:
                    amount, until = allowance.set_aside(now)
                    if amount:
                        _prepay(entry, depth, amount, until)
                return DUE if self.due else 0
        entry.debt += 1
        entry.debt_bytes += size
        flags = HELD
        if entry.held_since is None:
            entry.held_since = now
            self.held.add(key)
            flags = HELD | NEW_HOLD
        return flags | DUE if self.due else flags

    def publish(self, key: QueueKey, size: int, now: float) -> bool:
        """:meth:`spend` as a yes or no: True when the completion may go."""
        return not self.spend(key, size, now) & HELD

    def _settle(self, entry: _Queue, now: float) -> None:
        """Take back what the hub did not spend of its prepaid publishes; the
        rest joins the grant's use (``now``: the latest they can have been)."""
        depth = entry.prepaid_in
        if depth is None:
            return
        unused = max(0, depth.prepaid)
        if unused < entry.prepaid:
            entry.last_publish = now
        entry.allowance.settle_aside(unused, depth.prepaid_bytes)
        depth.prepaid = depth.prepaid_bytes = 0
        depth.prepaid_until = float("-inf")
        entry.prepaid_in = None
        entry.prepaid = 0

    def _settle_all(self, now: float) -> None:
        for entry in self.queues.values():
            if entry.prepaid_in is not None:
                self._settle(entry, now)

    def removed(self, key: QueueKey, messages: int, size: int) -> None:
        """Messages left the queue through this member (acks, rejects...)."""
        allowance = self._queue(key).allowance
        allowance.removed += messages
        allowance.removed_bytes += size

    def requests(self, now: float) -> list[Request]:
        """What to ask the owner now: allowance for queues running low or in
        debt, the first answer for queues never asked about, and removal
        reports that waited long enough."""
        self._settle_all(now)
        out: list[Request] = []
        for _key, entry in self.queues.items():
            free = now < entry.free_until
            allowance = entry.allowance
            # Allowance is asked for queues published to within a lease only
            # (a queue this member only consumes from gets reports, no grants).
            publishing = now - entry.last_publish < self.lease and not free
            request = allowance.wants(now) if publishing else None
            if (
                request is None
                and free
                and now - entry.last_publish < FREE_FOR_S
                and entry.free_until - now < FREE_FOR_S / 2
                and (allowance.asked_at is None or now - allowance.asked_at >= self.lease / 4)
            ):
                # Still in use: renew the owner's "no thresholds" before it lapses.
                allowance.asked_at = now
                request = Request(self.member, allowance.queue, now, tuple(allowance.reports(now)))
            if (
                request is None
                and entry.debt
                and not free
                and allowance.flow is Flow.OFF
                and (allowance.asked_at is None or now - allowance.asked_at >= self.lease / 4)
            ):
                # In debt with allowance unusable (expired): ask at once,
                # unless an unanswered ask is younger than a quarter lease.
                allowance.asked_at = now
                request = Request(
                    self.member, allowance.queue, now, tuple(allowance.reports(now, flush=True))
                )
            if request is None and now - entry.last_report >= REPORT_EVERY_S:
                reports = allowance.reports(now)
                if reports:
                    request = Request(self.member, allowance.queue, float("nan"), tuple(reports))
            if request is not None:
                entry.last_report = now
                out.append(request)
        self.due = False
        return out

    def busy(self, now: float) -> bool:
        """Whether rounds are needed soon: something held, due or unreported,
        a grant still open, or a queue published to within a lease."""
        if self.held or self.due:
            return True
        self._settle_all(now)
        for entry in self.queues.values():
            allowance = entry.allowance
            if (
                entry.debt
                or now - entry.last_publish < self.lease
                or allowance.removed
                or allowance.removed_bytes
                or allowance.holds_grants()
            ):
                return True
        return False

    def granted(self, key: QueueKey, grant: Grant, now: float) -> bool:
        """A grant arrived: pay the debt; True when the queue is no longer held."""
        if grant.epoch < self.epoch:
            return False
        self.epoch = max(self.epoch, grant.epoch)
        entry = self._queue(key)
        entry.allowance.granted(grant)
        return self._pay(key, entry, now)

    def _pay(self, key: QueueKey, entry: _Queue, now: float) -> bool:
        allowance = entry.allowance
        while entry.debt:
            size = entry.debt_bytes // entry.debt
            if not allowance.take(now, size):
                return False
            entry.debt -= 1
            entry.debt_bytes -= size
        return self._release(key, entry)

    def _release(self, key: QueueKey, entry: _Queue) -> bool:
        if entry.held_since is None:
            return False
        entry.held_since = None
        self.held.discard(key)
        self.flowed.discard(key)
        return True

    def free(self, key: QueueKey, now: float) -> bool:
        """The owner says the queue has no thresholds: no allowance needed for
        a while, and held publishes go.  True when the queue was held."""
        entry = self._queue(key)
        self._settle(entry, now)
        entry.free_until = now + FREE_FOR_S
        entry.allowance.asked_at = None
        entry.debt = entry.debt_bytes = 0
        return self._release(key, entry)

    def governed(self, key: QueueKey) -> None:
        """Thresholds were set on the queue: ask before the next completion."""
        entry = self.queues.get(key)
        if entry is not None:
            self._settle(entry, entry.last_publish)
            entry.free_until = float("-inf")

    def flow(self, key: QueueKey, update: FlowUpdate, now: float) -> bool:
        """The owner's flow state of a queue (what the hub holds prepaid
        comes back first: an ON queue's publishes wait).  An OFF queue's
        debt is paid from the allowance held; what that cannot pay is asked
        for at once (the owner tops up no member holding a batch, so held
        publishes must not wait for a grant).  True when the queue is no
        longer held."""
        self.epoch = max(self.epoch, update.epoch)
        entry = self._queue(key)
        self._settle(entry, now)
        allowance = entry.allowance
        allowance.flow_update(update)
        if not entry.debt or allowance.flow is Flow.ON:
            return False
        if self._pay(key, entry, now):
            return True
        self.due = True
        return False

    def tick(self, now: float) -> set[QueueKey]:
        """Promote long holds to flowed; the queues that changed."""
        changed: set[QueueKey] = set()
        for key in self.held - self.flowed:
            since = self.queues[key].held_since
            if since is not None and now - since >= FLOW_AFTER_S:
                self.flowed.add(key)
                changed.add(key)
        return changed

    def forget_idle(self, key: QueueKey, now: float) -> bool:
        """Drop a queue's entry (the queue is gone) when nothing of it is in
        hand: no held publish, no grant kept, nothing to report.  True when
        dropped, or not there.  A publish to the queue later starts afresh,
        without allowance, as for any queue new to this member."""
        entry = self.queues.get(key)
        if entry is None:
            return True
        self._settle(entry, now)
        allowance = entry.allowance
        if (
            entry.debt
            or key in self.held
            or allowance.holds_grants()
            or allowance.removed
            or allowance.removed_bytes
        ):
            return False
        del self.queues[key]
        return True

    def describe(self, now: float) -> list[dict[str, object]]:
        """Per queue: allowance left, debt, and whether held (for the admin API)."""
        self._settle_all(now)
        return [
            {
                "vhost": key[0],
                "name": key[1],
                "allowance": entry.allowance.available(now),
                "debt": entry.debt,
                "held": key in self.held,
                "free": now < entry.free_until,
            }
            for key, entry in sorted(self.queues.items())
        ]


def _name(key: QueueKey) -> str:
    return f"{key[0]}\x00{key[1]}"


@dataclass(slots=True)
class OwnerBook:
    """The owner's grant ledgers; ``epoch`` and ``started_at`` are this owner's."""

    member: str
    batch: int
    lease: float
    epoch: int
    started_at: float
    ledgers: dict[QueueKey, QueueOwner] = field(default_factory=dict)
    #: Where a new ledger's grant numbers start: past those of every ledger
    #: forgotten, so that no grant id of a queue is given twice.
    next_grant: int = 1

    def ledger(self, key: QueueKey) -> QueueOwner:
        ledger = self.ledgers.get(key)
        if ledger is None:
            ledger = self.ledgers[key] = QueueOwner(
                _name(key),
                stop=0,
                resume=0,
                batch=self.batch,
                lease=self.lease,
                epoch=self.epoch,
                started_at=self.started_at,
                next_grant=self.next_grant,
            )
        return ledger

    def forget(self, key: QueueKey) -> bool:
        """Drop a queue's ledger (the queue is gone) when no grant of it is
        outstanding; True when dropped, or not there."""
        ledger = self.ledgers.get(key)
        if ledger is None:
            return True
        if ledger.outstanding:
            return False
        self.next_grant = max(self.next_grant, ledger.next_grant)
        del self.ledgers[key]
        return True

    def settle(self, key: QueueKey, report: Report) -> int:
        """A member's report: how many messages it newly used (enqueued)."""
        return self.ledger(key).settle_report(report)

    def grant(
        self,
        key: QueueKey,
        request: Request,
        now: float,
        *,
        on: bool,
        stop: int = 0,
        depth: int = 0,
        sharers: int = 1,
    ) -> Grant | None:
        """A grant for a member's request, when the queue is OFF and one is
        due.  With a stop threshold (``stop`` messages) and the queue's
        ``depth``, what the queue can still take beside everything
        outstanding is shared among ``sharers`` members (M): far below the
        threshold a grant may be larger than a batch, and no grant takes
        depth plus everything outstanding past stop + M x B."""
        ledger = self.ledger(key)
        ledger.flow = Flow.ON if on else Flow.OFF
        room = 0
        limit = None
        if stop:
            free = stop - depth - ledger.outstanding
            room = free // max(1, sharers)
            limit = free + max(1, sharers) * self.batch
        return ledger.grant(request, now, room, limit)

    def expire(self, now: float) -> dict[QueueKey, int]:
        """Expired grants per queue: their remainder counts as enqueued."""
        out: dict[QueueKey, int] = {}
        for key, ledger in self.ledgers.items():
            expired = ledger.expire_grants(now)
            if expired:
                out[key] = expired
        return out

    def outstanding(self, key: QueueKey) -> int:
        ledger = self.ledgers.get(key)
        return 0 if ledger is None else ledger.outstanding

    def busy(self) -> bool:
        """Whether any grant is outstanding (to be settled or expired)."""
        return any(ledger.outstanding for ledger in self.ledgers.values())


@dataclass(slots=True)
class Missing:
    """Since when each queue of interest has been unknown to the hub: what
    tells a queue gone for sure (unknown for ``after`` seconds: several
    management snapshots in a row, as one may miss a queue for a moment)
    from one a snapshot missed."""

    after: float
    #: Queues of interest the hub does not know, since when.
    since: dict[QueueKey, float] = field(default_factory=dict)

    def overdue(
        self, keys: Iterable[QueueKey], known: Callable[[str, str], bool], now: float
    ) -> list[QueueKey]:
        """Of ``keys`` (the queues of interest now), those the hub has not
        known (``known``: by vhost and name) for ``after`` seconds; a queue
        known again, or no longer of interest, starts over."""
        wanted = set(keys)
        due: list[QueueKey] = []
        for key in wanted:
            if known(*key):
                self.since.pop(key, None)
            elif now - self.since.setdefault(key, now) >= self.after:
                due.append(key)
        for key in [key for key in self.since if key not in wanted]:
            del self.since[key]
        return due

    def forget(self, key: QueueKey) -> None:
        """The queue was dealt with: a later absence counts from the start."""
        self.since.pop(key, None)

    def clear(self) -> None:
        self.since.clear()


@dataclass(slots=True)
class GoneQueues:
    """Frees the books of queues that are gone: a member's allowance entry
    and an owner's grant ledger of a queue its hub has not known for
    ``after`` seconds (several management snapshots in a row: one may miss
    a queue for a moment, while a RabbitMQ node stops), once nothing of it
    is in hand (no held publish, no grant kept or outstanding).  Until
    then they stay: held publishes complete only against allowance, and the
    owner counts every grant it gave until it is settled or expires.
    """

    after: float
    #: Seconds between looks through the books.
    every: float = 1.0
    swept: float = float("-inf")
    #: Queues in the books the hub does not know, since when.
    missing: Missing = field(init=False)

    def __post_init__(self) -> None:
        self.missing = Missing(self.after)

    def sweep(
        self,
        now: float,
        known: Callable[[str, str], bool],
        book: MemberBook,
        owner: OwnerBook | None,
    ) -> list[QueueKey]:
        """Free what is due, at most every :attr:`every` seconds (``known``:
        whether the hub knows a queue, by vhost and name); the queues freed."""
        if now - self.swept < self.every:
            return []
        self.swept = now
        keys = set(book.queues)
        if owner is not None:
            keys.update(owner.ledgers)
        freed: list[QueueKey] = []
        for key in self.missing.overdue(keys, known, now):
            member_freed = book.forget_idle(key, now)
            if (owner is None or owner.forget(key)) and member_freed:
                self.missing.forget(key)
                freed.append(key)
        return freed
