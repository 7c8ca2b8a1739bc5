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

from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["BACKLOG", "EpochClaim"]

#: The most requests and reports kept while a claim is under way (members
#: ask again, each round, for what was not answered).
BACKLOG: Final = 10_000

#: A claim's phases: none under way, the record being read, the epoch being recorded.
_IDLE, _READING, _RECORDING = "", "reading", "recording"


@dataclass(slots=True)
class EpochClaim:
    """One member's claim: call :meth:`start` when handed the owner queue,
    then feed it the record's answers (:meth:`read`, :meth:`recorded`)."""

    phase: str = _IDLE
    #: The epoch being recorded (0: none).
    epoch: int = 0
    #: Requests and reports delivered meanwhile (see :data:`BACKLOG`).
    backlog: list[dict[str, Any]] = field(default_factory=list)

    @property
    def under_way(self) -> bool:
        return self.phase != _IDLE

    def start(self) -> bool:
        """Handed the owner queue: whether to read the record now (False:
        a claim is under way already)."""
        if self.phase != _IDLE:
            return False
        self.phase = _READING
        return True

    def read(self, recorded: int | None, heard: int) -> int:
        """The record's answer (``recorded`` None: RabbitMQ says it is empty)
        and the highest epoch heard: the epoch to record (0: no read was
        asked for)."""
        if self.phase != _READING:
            return 0
        self.phase = _RECORDING
        self.epoch = max(recorded or 0, heard) + 1
        return self.epoch

    def recorded(self, epoch: int, heard: int) -> bool | None:
        """RabbitMQ confirmed the record of ``epoch``: True: own with it
        (the claim is over); False: an epoch as high was heard meanwhile:
        read the record again; None: no record of this claim."""
        if self.phase != _RECORDING or epoch != self.epoch:
            return None
        if heard >= epoch:
            self.phase = _READING
            return False
        self.phase = _IDLE
        return True

    def keep(self, message: dict[str, Any]) -> bool:
        """A request or report from the owner queue: kept while a claim is
        under way (True), to be answered once it holds."""
        if self.phase == _IDLE:
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
        self.phase = _IDLE
        self.epoch = 0
        self.backlog = []
