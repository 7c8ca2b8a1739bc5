"""How the gateway runs Python's cycle collector.

A relayed frame allocates a few short-lived objects, almost none in
reference cycles, and a closed connection is freed by reference counting
alone (the relay breaks its cycles when both sockets are closed).  So the
collector's default pace, a young-generation pass every 700 allocations,
costs CPU (about 5% of the relay's, ``bench/relay_cpu.py``) for nothing.
:meth:`CollectorPolicy.install` raises that threshold to
:attr:`~CollectorSettings.young` and freezes what was loaded at start, so
no pass scans it again.

Raised thresholds alone would cost memory: what does die in a cycle (an
exception and its traceback, asyncio's own socket transport, a state file
written as indented JSON) would reach the oldest generation, which Python
then scans only every ``young * middle * old`` allocations, and would stay
there.  So :meth:`CollectorPolicy.run` (scheduled by the service) makes a
full collection every :attr:`~CollectorSettings.full_interval` seconds, so
cyclic garbage lives about that long.  A full pass scans every object the
gateway made since start (about 70 per open connection) and stops the
event loop meanwhile; when one takes longer than
:attr:`~CollectorSettings.budget` of the interval, the next waits longer,
so that full passes never take more than that share of the time.
:meth:`CollectorPolicy.stats` says how many passes ran, what they freed
and how long they took.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["FULL_INTERVAL_S", "CollectorPolicy", "CollectorSettings"]

#: Seconds between the full collections the service runs.
FULL_INTERVAL_S: Final = 10.0


@dataclass(frozen=True)
class CollectorSettings:
    """The collector's thresholds and the full-collection interval."""

    #: Allocations (net) between young-generation passes (Python's default: 700).
    young: int = 50_000
    #: Young passes between middle-generation passes (default 10).
    middle: int = 50
    #: Middle passes between old-generation passes (default 10); the
    #: periodic full collection makes this one rarely matter.
    old: int = 100
    #: Seconds between full collections (0: none, Python's own pace only).
    full_interval: float = FULL_INTERVAL_S
    #: The largest share of the time full collections may take: after a
    #: pass of ``d`` seconds the next comes ``max(full_interval, d / budget)``
    #: seconds later.
    budget: float = 0.01

    def __post_init__(self) -> None:
        for name in ("young", "middle", "old"):
            if getattr(self, name) < 1:
                raise ValueError(f"collector threshold {name} must be at least 1")
        if self.full_interval < 0:
            raise ValueError("full_interval must not be negative")
        if not 0 < self.budget <= 1:
            raise ValueError("budget must be a share of the time: more than 0, at most 1")


class CollectorPolicy:
    """Installs the thresholds and runs the periodic full collection.

    ``collect`` (``gc.collect`` by default) is called with generation 2;
    ``clock`` times each pass.
    """

    def __init__(
        self,
        settings: CollectorSettings | None = None,
        *,
        collect: Callable[[int], int] = gc.collect,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings or CollectorSettings()
        self._collect = collect
        self._clock = clock
        self.full_collections = 0
        self.freed = 0  # unreachable objects found by the full collections
        self.last_freed = 0
        self.last_duration = 0.0  # seconds the last full collection took
        self.longest = 0.0

    def install(self) -> None:
        """Freeze what is tracked now and set the thresholds (call once, at start)."""
        settings = self.settings
        gc.freeze()
        gc.set_threshold(settings.young, settings.middle, settings.old)

    def collect_now(self) -> int:
        """One full collection; returns how many unreachable objects it found."""
        start = self._clock()
        found = self._collect(2)
        duration = self._clock() - start
        self.full_collections += 1
        self.freed += found
        self.last_freed = found
        self.last_duration = duration
        self.longest = max(self.longest, duration)
        return found

    def next_interval(self) -> float:
        """Seconds until the next full collection: ``full_interval``, longer
        when the last pass took more than ``budget`` of it."""
        settings = self.settings
        return max(settings.full_interval, self.last_duration / settings.budget)

    async def run(self) -> None:
        """Collect every :meth:`next_interval` seconds until cancelled (never
        when ``full_interval`` is 0)."""
        if not self.settings.full_interval:
            return
        while True:
            await asyncio.sleep(self.next_interval())
            self.collect_now()

    def stats(self) -> dict[str, object]:
        """What the admin API shows about the collector."""
        young, middle, old = gc.get_threshold()
        return {
            "thresholds": [young, middle, old],
            "counts": list(gc.get_count()),
            "frozen": gc.get_freeze_count(),
            "full_interval_s": self.settings.full_interval,
            "next_interval_s": round(self.next_interval(), 3),
            "full_collections": self.full_collections,
            "freed": self.freed,
            "last_freed": self.last_freed,
            "last_duration_ms": round(self.last_duration * 1000, 3),
            "longest_ms": round(self.longest * 1000, 3),
        }
