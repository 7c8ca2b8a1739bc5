"""A member's claim to the owner's duties: the epoch it owns with (pure).

RabbitMQ hands the owner queue to one consumer at a time; the member it
delivers to is to be the owner.  Before it acts as one (a state broadcast,
a grant) it takes an epoch above every epoch ever taken, so that no two
owners share one (nor their grant ids), and no member that holds a later
epoch refuses it:

1. it reads the epochs record, the quorum queue ``rabbitflow.cluster.NAME.epochs``
   that holds the last epoch an owner took (a Basic.Get, the message put
   back at once: RabbitMQ answers from the queue's Raft log, so a record
   confirmed before is seen);
2. it takes one above the record and above every epoch heard on the bus
   (every message carrying an epoch tells the highest its sender knows);
3. it records that epoch in place of the last one and waits for RabbitMQ's
   publisher confirm;
4. confirmed, it owns, unless it heard meanwhile of an epoch as high: then
   it claims again, from 1.

A record that does not answer (an error, a timeout: the queue has no leader
while a node fails) is no answer at all: the bus drops the connection, the
claim with it, and the member owns nothing until it is handed the owner
queue again.  So only a record that RabbitMQ said is empty, on a cluster
where no member heard of any epoch, gives epoch 1, whose owner grants at
once (see :meth:`~rabbitflow_broker.engine.cluster.QueueOwner.granting`).

Requests and reports the owner queue delivers during a claim are kept, and
answered once it holds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rabbitflow_broker.engine.errors import StateError

__all__ = ["BACKLOG", "MOVES", "ClaimEvent", "ClaimPhase", "EpochClaim", "IllegalClaimMove"]

#: The most requests and reports kept while a claim is under way (members
#: ask again, each round, for what was not answered).
BACKLOG: Final = 10_000


class ClaimPhase(enum.Enum):
    """Where a claim is: none under way, the record being read, the epoch being recorded."""

    IDLE = "idle"
    READING = "reading"
    RECORDING = "recording"


class ClaimEvent(enum.Enum):
    """What moves a claim."""

    HANDED = "handed the owner queue"
    READ = "the record read"
    OUTBID = "recorded, but an epoch as high was heard"
    HELD = "recorded: owns"
    LOST = "the bus lost"


#: (phase, event) -> next phase; anything else is illegal.
MOVES: Final[Mapping[tuple[ClaimPhase, ClaimEvent], ClaimPhase]] = {
    (ClaimPhase.IDLE, ClaimEvent.HANDED): ClaimPhase.READING,
    (ClaimPhase.READING, ClaimEvent.READ): ClaimPhase.RECORDING,
    (ClaimPhase.RECORDING, ClaimEvent.OUTBID): ClaimPhase.READING,
    (ClaimPhase.RECORDING, ClaimEvent.HELD): ClaimPhase.IDLE,
    **{(phase, ClaimEvent.LOST): ClaimPhase.IDLE for phase in ClaimPhase},
}


class IllegalClaimMove(StateError):
    """A (phase, event) pair :data:`MOVES` does not allow; names both."""

    def __init__(self, phase: ClaimPhase, event: ClaimEvent) -> None:
        super().__init__(f"epoch claim: no move from {phase.name} on {event.name}")
        self.phase = phase
        self.event = event


@dataclass(slots=True)
class EpochClaim:
    """One member's claim: call :meth:`start` when handed the owner queue,
    then feed it the record's answers (:meth:`read`, :meth:`recorded`).
    An answer that belongs to no claim under way (a late one, after the bus
    was lost) is ignored, never a move."""

    phase: ClaimPhase = ClaimPhase.IDLE
    #: The epoch being recorded (0: none).
    epoch: int = 0
    #: Requests and reports delivered meanwhile (see :data:`BACKLOG`).
    backlog: list[dict[str, Any]] = field(default_factory=list)

    @property
    def under_way(self) -> bool:
        return self.phase is not ClaimPhase.IDLE

    def _move(self, event: ClaimEvent) -> None:
        try:
            self.phase = MOVES[(self.phase, event)]
        except KeyError:
            raise IllegalClaimMove(self.phase, event) from None

    def start(self) -> bool:
        """Handed the owner queue: whether to read the record now (False:
        a claim is under way already)."""
        if self.under_way:
            return False
        self._move(ClaimEvent.HANDED)
        return True

    def read(self, recorded: int | None, heard: int) -> int:
        """The record's answer (``recorded`` None: RabbitMQ says it is empty)
        and the highest epoch heard: the epoch to record (0: no read was
        asked for)."""
        if self.phase is not ClaimPhase.READING:
            return 0
        self._move(ClaimEvent.READ)
        self.epoch = max(recorded or 0, heard) + 1
        return self.epoch

    def recorded(self, epoch: int, heard: int) -> bool | None:
        """RabbitMQ confirmed the record of ``epoch``: True: own with it
        (the claim is over); False: an epoch as high was heard meanwhile:
        read the record again; None: no record of this claim."""
        if self.phase is not ClaimPhase.RECORDING or epoch != self.epoch:
            return None
        if heard >= epoch:
            self._move(ClaimEvent.OUTBID)
            return False
        self._move(ClaimEvent.HELD)
        return True

    def keep(self, message: dict[str, Any]) -> bool:
        """A request or report from the owner queue: kept while a claim is
        under way (True), to be answered once it holds."""
        if not self.under_way:
            return False
        if len(self.backlog) < BACKLOG:
            self.backlog.append(message)
        return True

    def take(self) -> list[dict[str, Any]]:
        """The requests and reports kept (the claim holds: answer them)."""
        backlog, self.backlog = self.backlog, []
        return backlog

    def drop(self) -> None:
        """The claim failed (the bus was lost): nothing of it is kept."""
        self._move(ClaimEvent.LOST)
        self.epoch = 0
        self.backlog = []
