"""What the event loop does after a turn in which it read from clients.

Clients such as pika write every frame with its own ``send()``.  The
compiled gateway handles a read in a few microseconds and would be back
asleep in ``epoll_wait`` before the next frames arrive, so every few frames
cost a wake-up, paid in kernel time by the gateway and by the sending
client.  On a machine where client, gateway and RabbitMQ share few cores
that time comes straight out of the message rate.

:class:`ReadPause` is the policy, built once by the service from
``--read-pause-us`` and shared by every connection of the event loop (the
relay's pump calls :meth:`ReadPause.after_read` for each client read):

* after a turn with reads of a **streaming** client (one that waits for
  nothing from RabbitMQ: no publish awaiting its confirm, no delivery
  awaiting its ack), the loop calls ``os.sched_yield()`` once, on the next
  turn: a process waiting for this core (often the sender itself) runs
  first, and the loop then finds more bytes ready instead of sleeping for
  them;
* after a turn with reads of a **pipelining** client (at least
  :data:`PIPELINED` messages in its pipe), the loop sleeps ``pause_us``
  microseconds instead, like a network card that holds its interrupts for
  a moment under load: such a client and RabbitMQ have far more than that
  sleep's worth of work in flight, so it costs them no throughput, and the
  next turn reads and writes more per system call;
* a client with a few messages in its pipe (a publisher waiting for each
  confirm) is waiting for RabbitMQ, not about to send more: the loop goes
  straight back to ``epoll_wait``, where RabbitMQ's answer wakes it.

At most one yield or sleep per loop turn, however many connections read in
it, and never before what was read went on.  ``pause_us = 0`` turns the
policy off (neither yield nor sleep); :data:`OFF` is that policy, the one
a relay built without a policy uses.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["DEFAULT_PAUSE_US", "OFF", "PIPELINED", "Loop", "ReadPause"]

#: Messages a connection keeps outstanding (unconfirmed publishes plus unacked
#: deliveries) from which a read of it makes the loop sleep instead of yield.
PIPELINED: Final = 32
#: The default ``--read-pause-us`` (the kernel adds its timer slack, 50 µs by default).
DEFAULT_PAUSE_US: Final = 100


class Loop(Protocol):
    """What the policy needs of an event loop."""

    def call_soon(self, callback: Callable[[], object]) -> object: ...


class ReadPause:
    """One ``sched_yield`` or one short sleep per loop turn with client reads.

    Raises:
        ValueError: a negative ``pause_us``.
    """

    def __init__(
        self,
        pause_us: int = DEFAULT_PAUSE_US,
        *,
        give_away: Callable[[], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if pause_us < 0:
            raise ValueError(f"pause_us must not be negative, got {pause_us}")
        self.pause_us = pause_us
        self._pause_s = pause_us / 1e6
        self._give_away = give_away or getattr(os, "sched_yield", None)
        self._sleep = sleep or time.sleep
        self._loop: Loop | None = None
        self._pending = False
        self._pipelined = False  # a connection read this turn keeps a deep pipe
        self._streaming = False  # a connection read this turn waits for nothing
        self.yields = 0  # how many times the CPU was given away
        self.sleeps = 0  # how many of those were a sleep

    def __repr__(self) -> str:
        return f"ReadPause(pause_us={self.pause_us})"

    @property
    def on(self) -> bool:
        """Whether the policy yields or sleeps at all."""
        return self.pause_us > 0

    def after_read(self, loop: Loop | None, outstanding: int = 0) -> None:
        """A client read was handled on ``loop``, of a connection with
        ``outstanding`` messages in its pipe: yield or sleep on the next turn."""
        if loop is None or self.pause_us == 0:
            return
        if outstanding >= PIPELINED:
            self._pipelined = True
        elif outstanding == 0:
            self._streaming = True
        else:
            return
        if self._pending and self._loop is loop:
            return
        self._loop, self._pending = loop, True
        loop.call_soon(self._run)

    def _run(self) -> None:
        self._pending = False
        pipelined, self._pipelined, self._streaming = self._pipelined, False, False
        if pipelined:
            self.yields += 1
            self.sleeps += 1
            self._sleep(self._pause_s)
        elif self._give_away is not None:
            self.yields += 1
            self._give_away()


#: No yield, no sleep.
OFF: Final = ReadPause(0)
