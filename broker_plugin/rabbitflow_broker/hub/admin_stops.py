"""Administrator stops of producers (``POST /api/producers/stop``).

A stop is ``(vhost, queue)``: ``(None, None)`` stops every producer,
``(vhost, None)`` every producer of a vhost (CHN-1005 names
``** All Queues **``), ``(vhost, queue)`` or ``(None, queue)`` publishes
routed to that queue.  :class:`AdminStops` owns them, oldest first; the hub
asks it and wakes the connections concerned.
"""

from __future__ import annotations

__all__ = ["AdminStops", "Stop"]

Stop = tuple[str | None, str | None]


class AdminStops:
    """The administrator stops in force, oldest first."""

    def __init__(self) -> None:
        #: The stops (a dict for order without duplicates); the hub's blocking
        #: checks read it inline (they run per publish: no call while it is empty).
        self.keys: dict[Stop, None] = {}

    def vhost_stopped(self, vhost: str) -> bool:
        """Whether every producer of the vhost is stopped."""
        keys = self.keys
        return bool(keys) and ((None, None) in keys or (vhost, None) in keys)

    def queue_stopped(self, vhost: str, queue: str) -> bool:
        """Whether publishes routed to the queue are stopped (by a queue stop)."""
        keys = self.keys
        return bool(keys) and ((vhost, queue) in keys or (None, queue) in keys)

    def add(self, vhost: str | None, queue: str | None) -> None:
        """Stop (stopping twice is the same as once)."""
        self.keys[(vhost, queue)] = None

    def remove(self, vhost: str | None, queue: str | None) -> bool:
        """Lift the stop with exactly these arguments; whether there was one."""
        return self.keys.pop((vhost, queue), 0) is None

    def replace(self, stops: list[Stop]) -> bool:
        """Take these stops instead (in place); whether anything changed."""
        if list(self.keys) == stops:
            return False
        self.keys.clear()
        self.keys.update(dict.fromkeys(stops))
        return True

    def listing(self) -> list[dict[str, str | None]]:
        """The stops in the admin API's shape, oldest first."""
        return [{"vhost": vhost, "queue": queue} for vhost, queue in self.keys]
