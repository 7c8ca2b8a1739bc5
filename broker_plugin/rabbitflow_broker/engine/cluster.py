"""One flow state for several gateways: allowances from one owner per queue (pure).

Several gateways (*members*) in front of one RabbitMQ keep one bound on
each queue's depth: ``stop + sum(c) + M x B`` for producers of capacities
``c1..cn`` honouring flow control, ``M`` members and batch ``B``
(``--cluster-batch``), whatever the publish rate and whatever fails.

How (the arbiter-with-credits family, as NATS JetStream and Artemis do it):

* Each queue's accounting has one **owner** (:class:`QueueOwner`), elected
  by the I/O layer.  It knows the queue's depth ``D`` (from RabbitMQ and
  the members' reports) and the **allowance** it has granted and not yet
  seen used (*outstanding*).  It tops each member up to at most ``B``
  outstanding messages, and only while the queue is OFF (``D`` at most its
  stop threshold), so at most ``stop + M x B`` messages ever complete
  against allowance; it decides the queue's flow state (OFF to ON when
  ``D`` exceeds a stop threshold, ON to OFF under resume) and is the only
  one to log it.
* A **member** (:class:`MemberAllowance`) lets a publish to the queue
  complete (forwards its confirm) only against allowance it holds; without
  allowance it holds the confirm and flows the channel, exactly as for a
  queue that is ON, and asks for a batch.  It reports what it used and
  what its clients removed in batches: it talks to the owner at most once
  per ``B`` messages per queue, never once per message.
* **Leases fence everything.**  A grant is valid for ``lease`` seconds from
  the moment the member *asked* for it, on the member's clock; the owner
  counts it outstanding until ``lease`` after it *sent* it, on its own.  So
  a member stops using a grant before the owner forgets it, whatever the
  two clocks read (only their rates must agree).  A member cut off from the
  owner for longer than the lease has no allowance left and holds every
  completion: it fails closed.  The owner, when a grant expires unreported,
  counts it as used (the messages may be in the queue) until RabbitMQ's own
  count corrects it.  A new owner grants nothing for one lease, so every
  grant of its predecessor has expired.

The owner's depth is exact for what the members report: each message used
against allowance was enqueued, each reported removal left.  RabbitMQ's
own count (:meth:`QueueOwner.observe_depth`) is adopted only when no report
came in for a settle time before the count was asked for and until it
came back, as the single gateway's reconciliation does: then every message
reported is in the count and none is counted twice.  What no member sees
(consumers straight on RabbitMQ, expiry) is learnt that way.

Everything here is plain data and methods: the caller passes ``now``
(monotonic seconds) and carries the returned messages over whatever bus it
has (RabbitMQ, in the service).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_LEASE_S",
    "MAX_GRANT_BATCHES",
    "MAX_RAMP_BATCHES",
    "Flow",
    "FlowUpdate",
    "Grant",
    "MemberAllowance",
    "QueueOwner",
    "Report",
    "Request",
]

#: ``--cluster-batch``: the most one member may accept for a queue unseen.
DEFAULT_BATCH: Final = 100
#: ``--cluster-lease``: how long a grant (and an owner's silence) may last.
DEFAULT_LEASE_S: Final = 2.0
#: Far below its stop threshold a queue's grants may reach this many batches
#: (a member's first, and one that asks no faster than :data:`RAMP_LEASES`).
MAX_GRANT_BATCHES: Final = 16
#: A member that asks again within this many leases of its last grant (it used
#: half of it by then) may get twice as much next time, up to
#: :data:`MAX_RAMP_BATCHES` batches: a fast publisher asks a few times a
#: second, not once per 16 batches.  One that asks after more than
#: :data:`CALM_LEASES` is back to :data:`MAX_GRANT_BATCHES`.
RAMP_LEASES: Final = 0.125
CALM_LEASES: Final = 0.5
MAX_RAMP_BATCHES: Final = 256


class Flow(enum.Enum):
    """A queue's flow state as the owner decided it."""

    OFF = "off"
    ON = "on"


@dataclass(frozen=True, slots=True)
class Report:
    """A member used ``used`` of grant ``grant_id`` and saw ``removed`` messages leave."""

    member: str
    queue: str
    grant_id: int
    used: int
    removed: int
    returned: bool = False
    used_bytes: int = 0
    removed_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """A member asks for allowance; ``asked_at`` is on the member's clock.

    It carries the member's reports up to now, applied first: the owner then
    counts as outstanding only what the member can still use.
    """

    member: str
    queue: str
    asked_at: float
    reports: tuple[Report, ...] = ()


@dataclass(frozen=True, slots=True)
class Grant:
    """The owner grants ``amount`` messages, valid from ``asked_at`` (member clock)."""

    member: str
    queue: str
    grant_id: int
    amount: int
    asked_at: float
    epoch: int


@dataclass(frozen=True, slots=True)
class FlowUpdate:
    """The owner's flow state of a queue, for every member."""

    queue: str
    flow: Flow
    epoch: int


@dataclass(slots=True)
class _Outstanding:
    member: str
    remaining: int
    expires_at: float


@dataclass(slots=True)
class _Pace:
    """When a member was last granted allowance for a queue, and its cap."""

    granted_at: float
    batches: int = MAX_GRANT_BATCHES


@dataclass(slots=True)
class QueueOwner:
    """The owner's accounting of one queue.

    ``stop``/``resume`` are message counts (0 stop: flow control off for the
    queue); ``epoch`` rises with each new owner.  Byte thresholds follow
    the same rules in the service and are left out here.
    """

    queue: str
    stop: int
    resume: int
    batch: int = DEFAULT_BATCH
    lease: float = DEFAULT_LEASE_S
    epoch: int = 1
    started_at: float = 0.0
    depth: int = 0
    flow: Flow = Flow.OFF
    flow_stopped_count: int = 0
    version: int = 0
    #: Seconds without reports before RabbitMQ's count is adopted.
    settle: float = 0.25
    changed_at: float = float("-inf")
    _grants: dict[int, _Outstanding] = field(default_factory=dict)
    #: The next grant's number in this owner's epoch (ids: epoch << 32 + number).
    next_grant: int = 1
    _paces: dict[str, _Pace] = field(default_factory=dict)

    @property
    def outstanding(self) -> int:
        """Granted allowance not yet reported used or returned."""
        return sum(g.remaining for g in self._grants.values())

    def granting(self, now: float) -> bool:
        """Whether this owner may grant yet: a new owner waits one lease, but
        for the first of the cluster (epoch 1: no member has heard of an owner
        before, as every bus message carries the epoch its sender knows)."""
        return now - self.started_at >= self.lease or self.epoch == 1

    def request(
        self, request: Request, now: float, *, sharers: int = 0
    ) -> tuple[Grant | None, FlowUpdate | None]:
        """A member asks for a batch: the grant (None while none is due), and
        the flow change its reports caused (or None).  ``sharers`` > 0: what
        the queue can take below its stop threshold beside everything
        outstanding is shared among that many members (see :meth:`grant`)."""
        update = None
        for report in request.reports:
            update = self.report(report, now) or update
        update = self.expire(now) or update
        room = 0
        limit = None
        if sharers and self.stop:
            free = self.stop - self.depth - self.outstanding
            room = free // sharers
            limit = free + sharers * self.batch
        return self._grant(request, now, room, limit), update

    def _grant(
        self, request: Request, now: float, room: int = 0, limit: int | None = None
    ) -> Grant | None:
        if not self.granting(now) or self.flow is Flow.ON:
            return None
        # Topped up to one batch per member: outstanding <= M x B.  More only
        # out of ``room``, what the queue can take below its stop threshold
        # beside everything outstanding: then depth + outstanding <= stop.
        held = sum(g.remaining for g in self._grants.values() if g.member == request.member)
        cap = self._cap(request.member, now)
        amount = max(self.batch - held, min(room, cap * self.batch) - held)
        if limit is not None:
            # Never past stop + M x B in all (depth plus everything outstanding):
            # a member may still use a large grant it has not reported, while
            # top-ups to the others go on until the depth passes stop.
            amount = min(amount, limit)
        if amount <= 0:
            return None
        self._paces[request.member] = _Pace(now, cap)
        # Ids carry the owner's epoch, so no two owners ever issue the same one.
        grant_id = (self.epoch << 32) + self.next_grant
        self.next_grant += 1
        self._grants[grant_id] = _Outstanding(request.member, amount, now + self.lease)
        return Grant(request.member, self.queue, grant_id, amount, request.asked_at, self.epoch)

    def _cap(self, member: str, now: float) -> int:
        """The most batches a grant to ``member`` may reach out of the room:
        twice its last cap when it asks again soon after its last grant."""
        pace = self._paces.get(member)
        if pace is None or now - pace.granted_at > self.lease * CALM_LEASES:
            return MAX_GRANT_BATCHES
        if now - pace.granted_at <= self.lease * RAMP_LEASES:
            return min(MAX_RAMP_BATCHES, pace.batches * 2)
        return pace.batches

    def report(self, report: Report, now: float) -> FlowUpdate | None:
        """Used allowance joins the depth, removals leave it; a flow change, or None."""
        self.depth += self.settle_report(report)
        self.depth = max(0, self.depth - report.removed)
        self.version += 1
        self.changed_at = now
        return self._judge()

    def settle_report(self, report: Report) -> int:
        """The ledger's part of :meth:`report`: the grant's use is settled;
        returns how much of it counts as newly used (the caller's depth)."""
        grant = self._grants.get(report.grant_id)
        if grant is None or grant.member != report.member:
            return 0
        used = min(report.used, grant.remaining)
        grant.remaining -= used
        if report.returned or grant.remaining == 0:
            del self._grants[report.grant_id]
        return used

    def expire(self, now: float) -> FlowUpdate | None:
        """Grants past their lease count as used (their messages may be queued)."""
        self.depth += self.expire_grants(now)
        return self._judge()

    def expire_grants(self, now: float) -> int:
        """The ledger's part of :meth:`expire`: drops grants past their lease
        and returns their unreported remainder (to count as used)."""
        expired = 0
        for grant_id, grant in list(self._grants.items()):
            if now >= grant.expires_at:
                expired += grant.remaining
                del self._grants[grant_id]
        if self._paces:  # members gone quiet (or gone) start again from the base cap
            for member in [
                m for m, pace in self._paces.items() if now - pace.granted_at > self.lease
            ]:
                del self._paces[member]
        return expired

    def grant(
        self, request: Request, now: float, room: int = 0, limit: int | None = None
    ) -> Grant | None:
        """A grant for ``request`` when one is due (ledger only: the caller
        decides the flow state and sets :attr:`flow` first, and expires
        grants with :meth:`expire_grants`).  ``room``: messages the queue
        can take below its stop threshold beyond its depth and everything
        outstanding, shared out by the caller; a grant may use it up to
        :data:`MAX_GRANT_BATCHES` batches (more for a member that uses its
        grants fast).  ``limit``: the most the grant may be, so that depth
        plus everything outstanding stays within stop + M x B."""
        return self._grant(request, now, room, limit)

    def held_by(self, member: str) -> int:
        """Outstanding allowance of one member."""
        return sum(g.remaining for g in self._grants.values() if g.member == member)

    def observe_depth(self, messages: int, seen_version: int, now: float) -> FlowUpdate | None:
        """RabbitMQ's count, asked for when :attr:`version` was ``seen_version``:
        adopted when no report came in since, nor for :attr:`settle` before
        (every message reported used is then in the count, and none twice);
        a flow change, or None."""
        if seen_version != self.version or now - self.changed_at < self.settle:
            return None
        self.depth = messages
        return self._judge()

    def _judge(self) -> FlowUpdate | None:
        if not self.stop:
            return None
        if self.flow is Flow.OFF and self.depth > self.stop:
            self.flow = Flow.ON
            self.flow_stopped_count += 1
            return FlowUpdate(self.queue, Flow.ON, self.epoch)
        if self.flow is Flow.ON and self.depth < self.resume:
            self.flow = Flow.OFF
            return FlowUpdate(self.queue, Flow.OFF, self.epoch)
        return None


@dataclass(slots=True)
class _Held:
    grant_id: int
    remaining: int
    valid_until: float
    used: int = 0
    used_bytes: int = 0


@dataclass(slots=True)
class MemberAllowance:
    """One member's allowance for one queue.

    :meth:`take` is the per-message call (a publish routed to the queue is
    about to complete); everything else is per batch.
    """

    member: str
    queue: str
    batch: int = DEFAULT_BATCH
    lease: float = DEFAULT_LEASE_S
    flow: Flow = Flow.OFF
    epoch: int = 0
    removed: int = 0
    removed_bytes: int = 0
    asked_at: float | None = None
    #: The last grant's size: the next is asked for when half of it is left.
    last_amount: int = 0
    #: Twice the allowance left at which to ask: the last grant, a batch at least.
    ask_mark: int = 0
    #: Allowance left in the grants kept (expired ones too, until reported);
    #: what is set aside (:meth:`set_aside`) is not in it until settled.
    left: int = 0
    _grants: list[_Held] = field(default_factory=list)
    #: The grant allowance is set aside from, and how much (see :meth:`set_aside`).
    _aside: _Held | None = None
    _aside_amount: int = 0

    def available(self, now: float) -> int:
        """Allowance still usable at ``now``."""
        return sum(g.remaining for g in self._grants if now < g.valid_until)

    def holds_grants(self) -> bool:
        """Whether any grant is kept (usable, or with use to report)."""
        return bool(self._grants)

    def take(self, now: float, size: int = 0) -> bool:
        """Use one message of allowance; False: hold the completion instead."""
        if self.flow is Flow.ON:
            return False
        for grant in self._grants:
            if grant.remaining and now < grant.valid_until:
                grant.remaining -= 1
                grant.used += 1
                grant.used_bytes += size
                self.left -= 1
                return True
        return False

    def set_aside(self, now: float) -> tuple[int, float]:
        """Reserve allowance from the first usable grant for publishes the
        caller counts itself, up to one short of the point at which the
        allowance asks (so the publish that reaches it comes through
        :meth:`take`): how many, and until when they may be used.  Nothing
        while the queue is ON or something is set aside already."""
        if self.flow is Flow.ON or self._aside is not None:
            return 0, float("-inf")
        most = self.left - self.ask_mark // 2 - 1
        for grant in self._grants:
            if grant.remaining and now < grant.valid_until:
                amount = min(grant.remaining, most)
                if amount <= 0:
                    break
                grant.remaining -= amount
                self.left -= amount
                self._aside = grant
                self._aside_amount = amount
                return amount, grant.valid_until
        return 0, float("-inf")

    def settle_aside(self, unused: int, used_bytes: int) -> int:
        """What was set aside comes back: ``unused`` of it was not spent, the
        rest (``used_bytes`` in all) joins the grant's use; how many were
        spent.  Call it before anything reads the grants' use or what is left."""
        grant = self._aside
        if grant is None:
            return 0
        spent = self._aside_amount - unused
        grant.remaining += unused
        grant.used += spent
        grant.used_bytes += used_bytes
        self.left += unused
        self._aside = None
        self._aside_amount = 0
        return spent

    def wants(self, now: float) -> Request | None:
        """A request when allowance runs low (half a batch) and none is pending
        (an unanswered one is repeated after a quarter lease)."""
        if self.flow is Flow.ON:
            return None
        if self.asked_at is not None and now - self.asked_at < self.lease / 4:
            return None
        if self.available(now) * 2 > max(self.batch, self.last_amount):
            return None
        self.asked_at = now
        return Request(self.member, self.queue, now, tuple(self.reports(now, flush=True)))

    def granted(self, grant: Grant) -> None:
        """A grant arrived (older epochs than one already seen are refused)."""
        if grant.epoch < self.epoch:
            return
        self.epoch = grant.epoch
        if self.asked_at == grant.asked_at:
            self.asked_at = None
        self._grants.append(_Held(grant.grant_id, grant.amount, grant.asked_at + self.lease))
        self.last_amount = grant.amount
        self.ask_mark = max(self.batch, grant.amount)
        self.left += grant.amount

    def flow_update(self, update: FlowUpdate) -> None:
        """The owner's flow state (older epochs than one already seen are ignored)."""
        if update.epoch < self.epoch:
            return
        self.epoch = update.epoch
        if update.flow is Flow.OFF and self.flow is Flow.ON:
            self.asked_at = None  # ask at once
        self.flow = update.flow

    def reports(self, now: float, *, final: bool = False, flush: bool = False) -> list[Report]:
        """What to tell the owner: used allowance of each grant once half a
        batch is used or the grant is over, and removals; ``flush`` reports
        every use now, ``final`` returns every grant too."""
        out: list[Report] = []
        removed, self.removed = self.removed, 0
        removed_bytes, self.removed_bytes = self.removed_bytes, 0
        keep: list[_Held] = []
        for grant in self._grants:
            over = final or now >= grant.valid_until or grant.remaining == 0
            if over or grant.used * 2 >= self.batch or (flush and grant.used):
                out.append(
                    Report(
                        self.member,
                        self.queue,
                        grant.grant_id,
                        grant.used,
                        removed,
                        over,
                        grant.used_bytes,
                        removed_bytes,
                    )
                )
                removed = removed_bytes = 0
                grant.used = grant.used_bytes = 0
            if over:
                self.left -= grant.remaining
            else:
                keep.append(grant)
        self._grants = keep
        if removed or removed_bytes:
            out.append(Report(self.member, self.queue, 0, 0, removed, False, 0, removed_bytes))
        return out
