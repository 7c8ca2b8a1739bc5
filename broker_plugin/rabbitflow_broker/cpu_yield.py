"""Give the CPU away once after the event loop handled client reads.

Clients such as pika write every frame with its own ``send()`` (three per
publish).  The compiled gateway handles a read in a few microseconds and
would be back asleep in ``epoll_wait`` before the next frames arrive, so
every few frames cost a wake-up, paid in kernel time by the gateway and by
the sending client.  On a machine where client, gateway and RabbitMQ share
few cores that time comes straight out of the message rate.

After a turn of the loop that read from clients, :class:`CpuYield` calls
``os.sched_yield()`` once, on the next turn: a process waiting for this
core (often the sender itself) runs first, and the loop then finds more
bytes ready instead of sleeping for them.  On an idle core the call
returns at once.  It costs one system call per loop turn with client reads,
however many connections read in it, and never delays what was read: the
bytes went on before the yield.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

__all__ = ["CpuYield", "Loop", "cpu_yield"]


class Loop(Protocol):
    """What the yielder needs of an event loop."""

    def call_soon(self, callback: Callable[[], object]) -> object: ...


class CpuYield:
    """One ``sched_yield`` per loop turn that had client reads."""

    def __init__(self, give_away: Callable[[], None] | None = None) -> None:
        self._give_away = give_away or getattr(os, "sched_yield", None)
        self._loop: Loop | None = None
        self._pending = False
        self.yields = 0  # how many times the CPU was given away

    def after_read(self, loop: Loop | None) -> None:
        """A client read was handled on ``loop``: yield on its next turn."""
        if loop is None or self._give_away is None or (self._pending and self._loop is loop):
            return
        self._loop, self._pending = loop, True
        loop.call_soon(self._run)

    def _run(self) -> None:
        self._pending = False
        if self._give_away is not None:
            self.yields += 1
            self._give_away()


#: The process's yielder (one event loop runs the gateway).
cpu_yield = CpuYield()
