"""Held publisher confirms of one channel (pure).

In confirm mode every publish gets a sequence number (1, 2, ...).  The
gateway remembers which queues each one was routed to.  When RabbitMQ acks
a sequence number (possibly ``multiple``), the ack is split per number; a
number whose queues are not all free (flow OFF, nothing else blocking) is
*held* until they are.  What may go to the client is returned as
:class:`Confirm` items that never acknowledge a held or still unconfirmed
number: ``multiple=True`` is used only over a run that starts at the lowest
number the client is still waiting for.  Nacks are never held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Confirm", "ConfirmTracker", "Route"]

Route = frozenset[str]
#: Decides whether a route is blocked (some queue overfull or stopped).
IsBlocked = Callable[[Route], bool]


@dataclass(frozen=True, slots=True)
class Confirm:
    """One Basic.Ack / Basic.Nack to send to the client."""

    tag: int
    multiple: bool
    ack: bool


class ConfirmTracker:
    """Sequence numbers of one confirm-mode channel, from publish to client confirm."""

    def __init__(self) -> None:
        self.next_seq = 1
        # seq -> route, for publishes RabbitMQ has not confirmed yet.
        self._unconfirmed: dict[int, Route] = {}
        # seq -> route, acked by RabbitMQ, held from the client.
        self._held: dict[int, Route] = {}
        # Every seq the client still waits for (unconfirmed or held), in order.
        self._outstanding: dict[int, None] = {}

    @property
    def held(self) -> int:
        """How many confirms are held from the client."""
        return len(self._held)

    @property
    def outstanding(self) -> int:
        """How many publishes the client still waits to have confirmed."""
        return len(self._outstanding)

    def held_routes(self) -> Iterable[Route]:
        """Routes of the held confirms."""
        return self._held.values()

    def published(self, route: Route) -> int:
        """Record a publish; returns its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        self._unconfirmed[seq] = route
        self._outstanding[seq] = None
        return seq

    def _covered(self, tag: int, multiple: bool) -> list[int]:
        if not multiple:
            return [tag] if tag in self._unconfirmed else []
        if tag == 0:
            return list(self._unconfirmed)
        covered: list[int] = []
        for seq in self._unconfirmed:  # insertion order is sequence order
            if seq > tag:
                break
            covered.append(seq)
        return covered

    def upstream_ack(
        self, tag: int, multiple: bool, is_blocked: IsBlocked
    ) -> tuple[list[Confirm], list[Route]]:
        """RabbitMQ acked ``tag``; return what to send the client now and the routes held.

        Held confirms whose routes are free again go with it: a block may lift
        (a cluster member's grant) before the hub re-checks what it holds, and
        a newer confirm must not overtake an older one of the same queue.
        """
        ready: list[int] = []
        held: list[Route] = []
        if self._held:
            ready = [seq for seq, route in self._held.items() if not is_blocked(route)]
            for seq in ready:
                del self._held[seq]
        for seq in self._covered(tag, multiple):
            route = self._unconfirmed.pop(seq)
            if route and is_blocked(route):
                self._held[seq] = route
                held.append(route)
            else:
                ready.append(seq)
        return self._emit(ready, ack=True), held

    def ack_one(self, tag: int, is_blocked: IsBlocked | None) -> bool:
        """Fast path of :meth:`upstream_ack` for a single ack: when ``tag`` is
        the oldest number the client waits for and its route is free, record
        it and return True (the ack goes to the client as it came); else
        change nothing and return False.  ``is_blocked`` None: nothing is
        blocked anywhere."""
        route = self._unconfirmed.get(tag)
        if route is None or (route and is_blocked is not None and is_blocked(route)):
            return False
        if next(iter(self._outstanding)) != tag:
            return False
        del self._unconfirmed[tag]
        del self._outstanding[tag]
        return True

    def ack_upto(self, tag: int, is_blocked: IsBlocked | None) -> bool:
        """Fast path of :meth:`upstream_ack` for a multiple ack: when nothing
        is held and every route it covers is free, record it and return True
        (the ack goes to the client as it came); else change nothing and
        return False.  With nothing held the client waits for exactly the
        unconfirmed numbers, so the covered ones are its oldest."""
        if self._held or tag == 0:
            return False
        unconfirmed, outstanding = self._unconfirmed, self._outstanding
        covered = self._covered(tag, True)
        if not covered or (
            is_blocked is not None
            and any(route and is_blocked(route) for route in map(unconfirmed.__getitem__, covered))
        ):
            return False
        for seq in covered:
            del unconfirmed[seq]
            del outstanding[seq]
        return True

    def upstream_nack(self, tag: int, multiple: bool) -> tuple[list[Confirm], list[Route]]:
        """RabbitMQ nacked ``tag``; nacks pass at once.  Also returns the nacked routes."""
        seqs = self._covered(tag, multiple)
        routes = [self._unconfirmed.pop(seq) for seq in seqs]
        return self._emit(seqs, ack=False), routes

    def release(self, is_blocked: IsBlocked) -> list[Confirm]:
        """Re-check held confirms; return those that may go to the client now."""
        if not self._held:
            return []
        ready = [seq for seq, route in self._held.items() if not is_blocked(route)]
        for seq in ready:
            del self._held[seq]
        return self._emit(ready, ack=True)

    def _emit(self, seqs: list[int], *, ack: bool) -> list[Confirm]:
        if not seqs:
            return []
        seqs.sort()
        out: list[Confirm] = []
        # A prefix of the client's outstanding numbers can go as one multiple ack.
        outstanding = iter(self._outstanding)
        run_end = 0
        for seq in seqs:
            if next(outstanding, None) != seq:
                break
            run_end = seq
        for seq in seqs:
            del self._outstanding[seq]
        if run_end:
            out.append(Confirm(run_end, run_end != seqs[0], ack))
        out.extend(Confirm(seq, False, ack) for seq in seqs if seq > run_end)
        return out
