"""The store quota of the gateway (Broker-J's disk quota, per vhost).

:class:`StoreQuotas` owns one :class:`~rabbitflow_broker.engine.store.StoreQuota`
machine per vhost, fed with measured store sizes (:meth:`~StoreQuotas.observe`)
plus the persistent bytes published through the gateway since
(:meth:`~StoreQuotas.persistent_published`).  An overfull vhost blocks every
producer of it: the hub reads :attr:`StoreQuotas.overfull` and is told of a
change through the ``wake`` it hands over.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable

from rabbitflow_broker.engine.store import StoreQuota, StoreSnapshot, StoreSource
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig

__all__ = ["StoreQuotas"]

# RabbitMQ's default collect_statistics_interval: how stale
# message_bytes_persistent from the management API can be.
_STATS_INTERVAL_S = 5.0


class StoreQuotas:
    """Every vhost's store quota machine and what feeds it."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        sink: Callable[[Event], None],
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float],
        wake: Callable[[str | None], None],
    ) -> None:
        #: True when ``--store-overfull-size`` is set.
        self.on = config.store_overfull_size > 0
        #: Vhosts whose quota is overfull: their producers are all blocked.
        self.overfull: set[str] = set()
        self._overfull_size = config.store_overfull_size
        self._underfull_size = config.store_underfull_size
        self._poll_s = config.store_poll_interval / 1000
        self._sink = sink
        self._clock = clock
        self._monotonic = monotonic
        self._wake = wake
        self._machines: dict[str, StoreQuota] = {}
        # Per vhost: the last measured store size, and persistent bytes
        # published through the gateway recently enough that the measurement
        # may not show them yet (monotonic time, bytes) with their sum.
        self._measured: dict[str, int] = {}
        self._recent: dict[str, deque[tuple[float, int]]] = {}
        self._recent_sum: dict[str, int] = {}

    def machine(self, vhost: str, source: StoreSource = "management") -> StoreQuota:
        """The vhost's quota machine, created on first use."""
        machine = self._machines.get(vhost)
        if machine is None:
            machine = self._machines[vhost] = StoreQuota(
                vhost, self._overfull_size, self._underfull_size, source=source
            )
        return machine

    def _window(self, source: StoreSource) -> float:
        # How old a measurement can be: the poll interval, plus RabbitMQ's
        # collect_statistics_interval (5 s by default) for the statistics.
        return self._poll_s + (_STATS_INTERVAL_S if source == "management" else 0.0)

    def observe(self, vhost: str, size: int, source: StoreSource) -> None:
        """A measured store size for a vhost; blocks or frees its producers on a transition.

        The quota machine sees the measurement plus the persistent bytes
        published through the gateway within the measurement's staleness
        window (see :meth:`persistent_published`).

        Raises:
            ValueError: a negative size.
        """
        if size < 0:
            raise ValueError(f"store size cannot be negative, got {size}")
        self.machine(vhost, source).source = source
        self._measured[vhost] = size
        self._evaluate(vhost)

    def persistent_published(self, vhost: str, size: int) -> None:
        """Persistent body bytes (times the queues routed to) just relayed to a vhost.

        Added to the last measurement until it is older than the staleness
        window, so the quota bites at the publish that crosses it instead
        of seconds later; counted twice at worst (already in a measurement),
        which only blocks early.
        """
        if not self.on:
            return
        recent = self._recent.get(vhost)
        if recent is None:
            recent = self._recent[vhost] = deque()
        recent.append((self._monotonic(), size))
        self._recent_sum[vhost] = self._recent_sum.get(vhost, 0) + size
        self._evaluate(vhost)

    def _evaluate(self, vhost: str) -> None:
        machine = self.machine(vhost)
        recent = self._recent.get(vhost)
        pending = 0
        if recent:
            horizon = self._monotonic() - self._window(machine.source)
            total = self._recent_sum[vhost]
            while recent and recent[0][0] < horizon:
                total -= recent.popleft()[1]
            self._recent_sum[vhost] = pending = total
        was_overfull = machine.overfull
        event = machine.observe(self._measured.get(vhost, 0) + pending, self._clock())
        if event is not None:
            self._sink(event)
        if machine.overfull != was_overfull:
            if machine.overfull:
                self.overfull.add(vhost)
            else:
                self.overfull.discard(vhost)
            self._wake(vhost)

    def snapshots(self) -> list[StoreSnapshot]:
        """Every vhost's store quota, by vhost name."""
        return [self._machines[vhost].snapshot() for vhost in sorted(self._machines)]
