"""What a cluster's members share besides the flow state: the administrator
stops and the runtime thresholds, merged change by change (pure).

The owner's every state carries all of it, so a member that missed a change
(it joined later, or its bus reconnected) has it at the next state, and a
member whose change the owner has not taken yet says it again.  Each setting
carries the stamp of its last change, ``(version, member)``: versions are a
hybrid logical clock, the wall clock's milliseconds where that is above every
version the member has seen, else one above the highest (so a change made
later wins, also on a member that has not merged any state yet, as long as
the members' wall clocks agree within the time between the two changes; and
a member's next change is always above every version it has seen); ties go
by member id, and a merge keeps each setting's newer stamp.  So two changes
made at once on two members both hold (on one queue's thresholds, the same
one wins everywhere), and members that saw the same stamps agree.  A
setting that went away (a lifted stop, thresholds gone with their queue)
keeps its stamp, so an older value cannot come back.

The caller passes the wall clock (``now``, in milliseconds): nothing here
reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rabbitflow_broker.engine.depth import QueueKey
from rabbitflow_broker.engine.flow import Thresholds

__all__ = [
    "SharedStops",
    "SharedThresholds",
    "Stop",
    "next_version",
    "thresholds_list",
    "thresholds_of",
]

#: An administrator stop: (vhost, queue), either None for every one.
Stop = tuple[str | None, str | None]

_K = TypeVar("_K")
_V = TypeVar("_V")


def next_version(clock: int, now: int) -> int:
    """A new change's version: the wall clock ``now`` (milliseconds), or one
    above ``clock`` (every version seen) where that is higher."""
    return max(now, clock + 1)


def _merge(
    mine: dict[_K, tuple[int, str, _V]], theirs: dict[_K, tuple[int, str, _V]], clock: int
) -> tuple[list[_K], list[_K], int]:
    """Take each stamp of ``theirs`` newer than ``mine``'s into ``mine``: the
    keys taken, the keys ``mine`` knows newer (or they lack), and ``clock``
    moved up to every version seen."""
    taken: list[_K] = []
    for key, stamp in theirs.items():
        clock = max(clock, stamp[0])
        held = mine.get(key)
        if held is None or stamp[:2] > held[:2]:
            mine[key] = stamp
            taken.append(key)
    ahead = [key for key, stamp in mine.items() if key not in theirs or stamp[:2] > theirs[key][:2]]
    return taken, ahead, clock


@dataclass(slots=True)
class SharedStops:
    """The administrator stops as the cluster knows them, merged stop by stop:
    each stop ever made has the stamp of its last change, ``(version, member,
    in force)``."""

    member: str
    stamps: dict[Stop, tuple[int, str, bool]] = field(default_factory=dict)
    clock: int = 0

    def note(self, local: Iterable[Stop], now: int = 0) -> None:
        """Stamp what was added or lifted here: ``local`` are the stops in
        force (``now``: the wall clock, milliseconds)."""
        held = set(local)
        changed = held ^ set(self.in_force())
        if changed:
            self.clock = next_version(self.clock, now)
            for key in changed:
                self.stamps[key] = (self.clock, self.member, key in held)

    def in_force(self) -> list[Stop]:
        """The stops in force, oldest change first."""
        stamped = sorted(self.stamps.items(), key=lambda item: item[1][:2])
        return [key for key, (_, _, on) in stamped if on]

    def wire(self) -> list[list[Any]]:
        """Every stamp as ``[vhost, queue, version, member, in force]``."""
        return [[v, q, n, m, on] for (v, q), (n, m, on) in self.stamps.items()]

    def merge(self, wire: list[list[Any]]) -> bool:
        """Take each newer stamp of :meth:`wire`'s output; whether this side
        knows something newer than it (then it should say so again)."""
        theirs = {(v, q): (int(n), str(m), bool(on)) for v, q, n, m, on in wire}
        _, ahead, self.clock = _merge(self.stamps, theirs, self.clock)
        return bool(ahead)


def thresholds_list(thresholds: Thresholds | None) -> list[int] | None:
    """Thresholds on the wire: ``[stop count, resume count, stop size, resume size]``."""
    if thresholds is None:
        return None
    t = thresholds
    return [t.stop_count, t.resume_count, t.stop_size, t.resume_size]


def thresholds_of(wire: list[Any] | None) -> Thresholds | None:
    """:func:`thresholds_list`'s output read back.

    Raises:
        ThresholdError: a value out of range (a ValueError).
        TypeError, ValueError: not four integers.
    """
    if wire is None:
        return None
    stop_count, resume_count, stop_size, resume_size = map(int, wire)
    return Thresholds(
        stop_count=stop_count,
        resume_count=resume_count,
        stop_size=stop_size,
        resume_size=resume_size,
    )


@dataclass(slots=True)
class SharedThresholds:
    """The runtime thresholds as the cluster knows them, merged queue by queue:
    each queue's stamp is ``(version, member, thresholds)``, thresholds None
    once they went with their queue (it was deleted)."""

    member: str
    stamps: dict[QueueKey, tuple[int, str, Thresholds | None]] = field(default_factory=dict)
    clock: int = 0

    def set(self, key: QueueKey, thresholds: Thresholds | None, now: int = 0) -> None:
        """Stamp a change made here (None: the thresholds went with the queue;
        ``now``: the wall clock, milliseconds)."""
        self.clock = next_version(self.clock, now)
        self.stamps[key] = (self.clock, self.member, thresholds)

    def get(self, key: QueueKey) -> Thresholds | None:
        """A queue's thresholds as the cluster knows them (None: none, or gone)."""
        stamp = self.stamps.get(key)
        return None if stamp is None else stamp[2]

    def in_force(self) -> dict[QueueKey, Thresholds]:
        """Every queue's thresholds that did not go with their queue."""
        return {key: t for key, (_, _, t) in self.stamps.items() if t is not None}

    def wire(self, keys: Iterable[QueueKey] | None = None) -> list[list[Any]]:
        """The stamps of ``keys`` (default: every one) as ``[vhost, queue,
        version, member, thresholds]`` (:func:`thresholds_list`)."""
        stamps = self.stamps
        chosen = stamps if keys is None else [key for key in keys if key in stamps]
        return [
            [key[0], key[1], *stamps[key][:2], thresholds_list(stamps[key][2])] for key in chosen
        ]

    def merge(
        self, wire: list[list[Any]]
    ) -> tuple[dict[QueueKey, Thresholds | None], list[QueueKey]]:
        """Take each newer stamp of :meth:`wire`'s output: the queues whose
        thresholds changed, or that this side had no stamp of, with their
        thresholds now (None: gone, to be forgotten), and the queues this
        side knows newer (or the other side lacks: then it should say them
        again).

        Raises:
            TypeError, ValueError: a malformed stamp (nothing is taken).
        """
        theirs = {(str(v), str(q)): (int(n), str(m), thresholds_of(th)) for v, q, n, m, th in wire}
        before = {key: self.stamps.get(key) for key in theirs}
        taken, ahead, self.clock = _merge(self.stamps, theirs, self.clock)
        changed = {
            key: self.get(key)
            for key in taken
            if (stamp := before[key]) is None or stamp[2] != self.get(key)
        }
        return changed, ahead
