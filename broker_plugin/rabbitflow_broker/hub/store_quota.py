"""The store quota of the gateway (Broker-J's disk quota, per vhost).

:class:`StoreQuotaMixin` gives :class:`~rabbitflow_broker.hub.gateway.Gateway`
one :class:`~rabbitflow_broker.engine.store.StoreQuota` machine per vhost, fed
with measured store sizes (:meth:`~StoreQuotaMixin.observe_store`) plus the
persistent bytes published through the gateway since
(:meth:`~StoreQuotaMixin.persistent_published`); an overfull vhost blocks
every producer of it (``Gateway.vhost_blocked``).
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable

from mypy_extensions import trait

from rabbitflow_broker.engine.store import StoreQuota, StoreSnapshot, StoreSource
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig

__all__ = ["StoreQuotaMixin"]

# RabbitMQ's default collect_statistics_interval: how stale
# message_bytes_persistent from the management API can be.
_STATS_INTERVAL_S = 5.0


@trait
class StoreQuotaMixin:
    """The store quota methods of :class:`~rabbitflow_broker.hub.gateway.Gateway`."""

    # The gateway's state these use, set by Gateway.__init__.
    config: GatewayConfig
    _sink: Callable[[Event], None]
    _clock: Callable[[], dt.datetime]
    _monotonic: Callable[[], float]
    _stores: dict[str, StoreQuota]
    _store_measured: dict[str, int]
    _store_recent: dict[str, deque[tuple[float, int]]]
    _store_recent_sum: dict[str, int]

    def wake(self, vhost: str | None) -> None:
        """Gateway's (a trait: compiled, Gateway mixes it in)."""
        raise NotImplementedError

    # -- store quota ---------------------------------------------------------

    def store(self, vhost: str, source: StoreSource = "management") -> StoreQuota:
        """The vhost's quota machine, created on first use."""
        machine = self._stores.get(vhost)
        if machine is None:
            machine = self._stores[vhost] = StoreQuota(
                vhost,
                self.config.store_overfull_size,
                self.config.store_underfull_size,
                source=source,
            )
        return machine

    @property
    def store_quota_on(self) -> bool:
        """True when ``--store-overfull-size`` is set."""
        return self.config.store_overfull_size > 0

    def _store_window(self, source: StoreSource) -> float:
        # How old a measurement can be: the poll interval, plus RabbitMQ's
        # collect_statistics_interval (5 s by default) for the statistics.
        poll = self.config.store_poll_interval / 1000
        return poll + (_STATS_INTERVAL_S if source == "management" else 0.0)

    def observe_store(self, vhost: str, size: int, source: StoreSource) -> None:
        """A measured store size for a vhost; blocks or frees its producers on a transition.

        The quota machine sees the measurement plus the persistent bytes
        published through the gateway within the measurement's staleness
        window (see :meth:`persistent_published`).

        Raises:
            ValueError: a negative size.
        """
        if size < 0:
            raise ValueError(f"store size cannot be negative, got {size}")
        self.store(vhost, source).source = source
        self._store_measured[vhost] = size
        self._evaluate_store(vhost)

    def persistent_published(self, vhost: str, size: int) -> None:
        """Persistent body bytes (times the queues routed to) just relayed to a vhost.

        Added to the last measurement until it is older than the staleness
        window, so the quota bites at the publish that crosses it instead
        of seconds later; counted twice at worst (already in a measurement),
        which only blocks early.
        """
        if not self.store_quota_on:
            return
        recent = self._store_recent.get(vhost)
        if recent is None:
            recent = self._store_recent[vhost] = deque()
        recent.append((self._monotonic(), size))
        self._store_recent_sum[vhost] = self._store_recent_sum.get(vhost, 0) + size
        self._evaluate_store(vhost)

    def _evaluate_store(self, vhost: str) -> None:
        machine = self.store(vhost)
        recent = self._store_recent.get(vhost)
        pending = 0
        if recent:
            horizon = self._monotonic() - self._store_window(machine.source)
            total = self._store_recent_sum[vhost]
            while recent and recent[0][0] < horizon:
                total -= recent.popleft()[1]
            self._store_recent_sum[vhost] = pending = total
        was_overfull = machine.overfull
        event = machine.observe(self._store_measured.get(vhost, 0) + pending, self._clock())
        if event is not None:
            self._sink(event)
        if machine.overfull != was_overfull:
            self.wake(vhost)

    def store_snapshots(self) -> list[StoreSnapshot]:
        """Every vhost's store quota, by vhost name."""
        return [self._stores[vhost].snapshot() for vhost in sorted(self._stores)]
