"""A sync transacted session's transaction, as connection losses leave it
(asyncio sessions are not transacted)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ._producer_core import ProducerCounters

__all__ = ["Sent", "Transaction", "sent_counts"]

#: Each producer's sends so far (``sent_count``).
Sent = Mapping[ProducerCounters, int]


def sent_counts(producers: Iterable[ProducerCounters]) -> Sent:
    """How many messages each of ``producers`` has sent so far."""
    return {producer: producer.sent_count for producer in producers}


class Transaction:
    """Whether the open transaction survived every connection loss.

    A recovery breaks it: what it sent and acknowledged went with the
    connection, so ``commit()`` rolls back and raises instead.  A rollback
    starts the next one whole, also when a loss interrupts it (the session
    rolls back again on the new connection: nothing of the old transaction
    survives a loss anyway), unless a message was sent while it ran: that
    one may belong to the next transaction and have gone with the
    connection, so the next one stays broken.

    Sans-IO; the session guards it with its lock, under which a recovery's
    restore calls ``lost``.
    """

    __slots__ = ("_broken",)

    def __init__(self) -> None:
        self._broken = False

    @property
    def broken(self) -> bool:
        """A recovery came since the last rollback: commit() must not commit."""
        return self._broken

    def lost(self) -> None:
        """A recovery restored the session on a new connection."""
        self._broken = True

    def rollback_started(self) -> None:
        """A rollback starts: it discards whatever a loss before it broke."""
        self._broken = False

    def rolled_back(self, sent_before: Sent, sent: Sent) -> None:
        """A rollback ended with a pass that ran on one connection from start
        to end; ``sent_before`` and ``sent`` count each producer's sends when
        the rollback started and now.  A loss while it ran broke the
        transaction: it is whole again if nothing was sent meanwhile."""
        if all(count <= sent_before.get(producer, 0) for producer, count in sent.items()):
            self._broken = False
