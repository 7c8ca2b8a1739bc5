"""A seeded simulation of several gateways sharing one queue's flow state.

Members relay the publishes of producers with fixed capacities into one
queue (an integer depth, as RabbitMQ holds it), hold completions they have
no allowance for, and talk to the queue's owner over a bus that delays,
drops and reorders messages.  Members and owners crash; producers of a
crashed member move to another one and resend what was not confirmed.
Consumers remove messages through a member (reported) or straight on
RabbitMQ (not reported).  The owner reads RabbitMQ's depth every poll.
Everything runs on one simulated clock.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from rabbitflow_broker.engine.cluster import (
    Flow,
    FlowUpdate,
    Grant,
    MemberAllowance,
    QueueOwner,
    Report,
    Request,
)
from rabbitflow_broker.engine.cluster_book import REPORT_EVERY_S

QUEUE = "orders"
STEP = 0.01


@dataclass
class Producer:
    """A producer of ``capacity`` that honours flow: at most that many unconfirmed."""

    pid: int
    capacity: int
    member: int
    unconfirmed: list[int] = field(default_factory=list)
    confirmed: int = 0
    next_seq: int = 0


@dataclass
class Member:
    index: int
    allowance: MemberAllowance
    held: list[tuple[int, int]] = field(default_factory=list)  # (producer, seq)
    alive: bool = True
    last_report: float = float("-inf")


@dataclass
class Bus:
    """Delivers messages after a random delay; drops some while unreliable."""

    rng: random.Random
    max_delay: float
    drop: float
    now: float = 0.0
    _queue: list[tuple[float, int, str, Any]] = field(default_factory=list)
    _seq: int = 0

    def send(self, to: str, message: Any) -> None:
        if self.rng.random() < self.drop:
            return
        self._seq += 1
        at = self.now + self.rng.uniform(0, self.max_delay)
        heapq.heappush(self._queue, (at, self._seq, to, message))

    def due(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        while self._queue and self._queue[0][0] <= self.now:
            _, _, to, message = heapq.heappop(self._queue)
            out.append((to, message))
        return out


class Simulation:
    """One run; :meth:`run` returns the peak depth, and checks liveness at the end."""

    def __init__(
        self,
        seed: int,
        *,
        members: int,
        capacities: list[int],
        stop: int,
        resume: int,
        batch: int,
        lease: float = 2.0,
        drop: float = 0.05,
        max_delay: float = 0.2,
        crash_rate: float = 0.0,
        owner_crash_rate: float = 0.0,
        poll: float = 0.25,
        room_grants: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.stop, self.resume, self.batch, self.lease = stop, resume, batch, lease
        self.poll = poll
        # Grants beyond a batch out of the room below the stop threshold.
        self.sharers = members if room_grants else 0
        self.bus = Bus(self.rng, max_delay, drop)
        self.now = 0.0
        self.depth = 0  # what RabbitMQ holds
        self.peak = 0
        self.members = [
            Member(i, MemberAllowance(f"m{i}", QUEUE, batch=batch, lease=lease))
            for i in range(members)
        ]
        self.producers = [Producer(pid, cap, pid % members) for pid, cap in enumerate(capacities)]
        self.crash_rate, self.owner_crash_rate = crash_rate, owner_crash_rate
        self.owner_member = 0
        # The first owner has waited its lease (as every new owner does) before t=0.
        self.owner = QueueOwner(
            QUEUE, stop, resume, batch=batch, lease=lease, epoch=1, started_at=-lease
        )
        self._next_poll = 0.0
        self.publishing = True
        #: The largest grant the owners issued.
        self.largest_grant = 0

    @property
    def bound(self) -> int:
        return self.stop + sum(p.capacity for p in self.producers) + len(self.members) * self.batch

    # -- one step ---------------------------------------------------------------

    def step(self, consume_rate: float, direct_share: float) -> None:
        self.now += STEP
        self.bus.now = self.now
        self._deliver()
        self._maybe_crash()
        if self.publishing:
            for producer in self.producers:
                self._publish(producer)
        for member in self.members:
            if member.alive:
                self._member_turn(member)
        self._consume(consume_rate, direct_share)
        self._owner_turn()
        self.peak = max(self.peak, self.depth)

    def _publish(self, producer: Producer) -> None:
        member = self.members[producer.member]
        if not member.alive:
            return
        flowed = any(pid == producer.pid for pid, _ in member.held)
        if flowed or len(producer.unconfirmed) >= producer.capacity:
            return
        seq = producer.next_seq
        producer.next_seq += 1
        producer.unconfirmed.append(seq)
        self.depth += 1  # relayed and enqueued at once
        if member.allowance.take(self.now):
            self._confirm(producer, seq)
        else:
            member.held.append((producer.pid, seq))

    def _confirm(self, producer: Producer, seq: int) -> None:
        producer.unconfirmed.remove(seq)
        producer.confirmed += 1

    def _member_turn(self, member: Member) -> None:
        allowance = member.allowance
        while member.held and allowance.take(self.now):
            pid, seq = member.held.pop(0)
            self._confirm(self.producers[pid], seq)
        request = allowance.wants(self.now)
        if request is not None:
            self.bus.send("owner", request)  # it carries the reports up to now
            member.last_report = self.now
        elif self.now - member.last_report >= REPORT_EVERY_S:
            # As a member's book does: use is reported with each request, else
            # every REPORT_EVERY_S (a member may use a whole grant meanwhile).
            member.last_report = self.now
            for report in allowance.reports(self.now):
                self.bus.send("owner", report)

    def _consume(self, rate: float, direct_share: float) -> None:
        for _ in range(self._poisson(rate * STEP)):
            if not self.depth:
                return
            self.depth -= 1
            if self.rng.random() >= direct_share:
                via = self.rng.choice([m for m in self.members if m.alive] or self.members)
                via.allowance.removed += 1

    def _poisson(self, mean: float) -> int:
        whole = int(mean)
        return whole + (1 if self.rng.random() < mean - whole else 0)

    def _owner_turn(self) -> None:
        for update in filter(None, [self.owner.expire(self.now)]):
            self._broadcast(update)
        if self.now >= self._next_poll:
            self._next_poll = self.now + self.poll
            update = self.owner.observe_depth(self.depth, self.owner.version, self.now)
            if update is not None:
                self._broadcast(update)
            else:  # members that missed an update hear it again
                self._broadcast(FlowUpdate(QUEUE, self.owner.flow, self.owner.epoch))

    def _broadcast(self, update: FlowUpdate) -> None:
        for member in self.members:
            self.bus.send(f"m{member.index}", update)

    def _deliver(self) -> None:
        for to, message in self.bus.due():
            if to == "owner":
                if not self.members[self.owner_member].alive:
                    continue
                if isinstance(message, Request):
                    grant, update = self.owner.request(message, self.now, sharers=self.sharers)
                    if grant is not None:
                        self.largest_grant = max(self.largest_grant, grant.amount)
                        self.bus.send(grant.member, grant)
                    if update is not None:
                        self._broadcast(update)
                elif isinstance(message, Report):
                    update = self.owner.report(message, self.now)
                    if update is not None:
                        self._broadcast(update)
                continue
            member = self.members[int(to[1:])]
            if not member.alive:
                continue
            if isinstance(message, Grant):
                member.allowance.granted(message)
            elif isinstance(message, FlowUpdate):
                member.allowance.flow_update(message)

    # -- failures -----------------------------------------------------------------

    def _maybe_crash(self) -> None:
        alive = [m for m in self.members if m.alive]
        if len(alive) > 1 and self.rng.random() < self.crash_rate * STEP:
            self._crash(self.rng.choice(alive))
        if len(alive) > 1 and self.rng.random() < self.owner_crash_rate * STEP:
            self._crash(self.members[self.owner_member])

    def _crash(self, member: Member) -> None:
        member.alive = False
        member.held.clear()  # its held publishes stay in the queue, unconfirmed
        alive = [m for m in self.members if m.alive]
        for producer in self.producers:
            if producer.member == member.index:
                # The SDK reconnects elsewhere and resends what was not confirmed
                # (duplicates: the old copies are still queued).
                producer.member = self.rng.choice(alive).index
                resend, producer.unconfirmed = producer.unconfirmed, []
                for _old in resend:  # through the new member like any publish
                    self._resend(producer, producer.next_seq)
                    producer.next_seq += 1
        if member.index == self.owner_member:
            self.owner_member = alive[0].index
            self.owner = QueueOwner(
                QUEUE,
                self.stop,
                self.resume,
                batch=self.batch,
                lease=self.lease,
                epoch=self.owner.epoch + 1,
                started_at=self.now,
                changed_at=self.now,
                depth=self.depth,
                flow=self.owner.flow,
            )

    def _resend(self, producer: Producer, seq: int) -> None:
        producer.unconfirmed.append(seq)
        self.depth += 1
        member = self.members[producer.member]
        if member.allowance.take(self.now):
            self._confirm(producer, seq)
        else:
            member.held.append((producer.pid, seq))

    # -- the whole run --------------------------------------------------------------

    def run(self, *, chaos_s: float, consume_rate: float, direct_share: float) -> None:
        """Chaos (drops, crashes, a slow consumer), then a reliable bus, no new
        publishes and a fast consumer: everything must be confirmed and released."""
        while self.now < chaos_s:
            self.step(consume_rate, direct_share)
            assert self.depth <= self.bound, (self.now, self.depth, self.bound)
        self.bus.drop = 0.0
        self.crash_rate = self.owner_crash_rate = 0.0
        self.publishing = False
        deadline = self.now + 4 * self.lease + 10
        while self.now < deadline:
            self.step(consume_rate=5000, direct_share=direct_share)
            assert self.depth <= self.bound
            if self.settled():
                return
        raise AssertionError(
            f"not settled: depth {self.depth}, flow {self.owner.flow}, "
            f"unconfirmed {sum(len(p.unconfirmed) for p in self.producers)}"
        )

    def settled(self) -> bool:
        return (
            self.depth == 0
            and self.owner.flow is Flow.OFF
            and all(not p.unconfirmed for p in self.producers if self.members[p.member].alive)
        )
