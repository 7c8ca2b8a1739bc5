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

When a connection that was read keeps a deep pipe (at least
:data:`PIPELINED` publishes waiting for their confirms plus deliveries
waiting for their acks), the loop sleeps :data:`COALESCE_S` instead, like a
network card that holds its interrupts for a moment under load.  Such a
client and RabbitMQ have far more than that sleep's worth of work in
flight, so it costs them no throughput, and the next turn reads and writes
more per system call: the gateway's CPU per message, mostly kernel time,
falls by up to a quarter (window-100 publishers of small messages).  A
client that waits for each confirm, or keeps a window under
:data:`PIPELINED`, never makes the gateway sleep; beside a pipelining
client on the same gateway it may wait one sleep longer.  At most one sleep
per loop turn, however many connections pipeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["COALESCE_S", "PIPELINED", "CpuYield", "Loop", "cpu_yield"]

#: Messages a connection keeps outstanding (unconfirmed publishes plus unacked
#: deliveries) from which a read of it makes the loop sleep instead of yield.
PIPELINED: Final = 32
#: How long that sleep lasts (the kernel adds its timer slack, 50 µs by default).
COALESCE_S: Final = 100e-6


class Loop(Protocol):
    """What the yielder needs of an event loop."""

    def call_soon(self, callback: Callable[[], object]) -> object: ...


class CpuYield:
    """One ``sched_yield`` (or, after a pipelining client's read, one short
    sleep) per loop turn that had client reads."""

    def __init__(
        self,
        give_away: Callable[[], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._give_away = give_away or getattr(os, "sched_yield", None)
        self._sleep = sleep or time.sleep
        self._loop: Loop | None = None
        self._pending = False
        self._pipelined = False  # a connection read this turn keeps a pipe
        self.yields = 0  # how many times the CPU was given away
        self.sleeps = 0  # how many of those were a sleep

    def after_read(self, loop: Loop | None, outstanding: int = 0) -> None:
        """A client read was handled on ``loop``, of a connection with
        ``outstanding`` messages in its pipe: yield (or sleep) on the next turn."""
        if loop is None:
            return
        if outstanding >= PIPELINED:
            self._pipelined = True
        if self._pending and self._loop is loop:
            return
        self._loop, self._pending = loop, True
        loop.call_soon(self._run)

    def _run(self) -> None:
        self._pending = False
        if self._pipelined:
            self._pipelined = False
            self.yields += 1
            self.sleeps += 1
            self._sleep(COALESCE_S)
        elif self._give_away is not None:
            self.yields += 1
            self._give_away()


#: The process's yielder (one event loop runs the gateway).
cpu_yield = CpuYield()
