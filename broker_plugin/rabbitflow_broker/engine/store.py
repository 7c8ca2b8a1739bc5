"""The per-vhost store quota (Broker-J's disk quota), sans-IO.

:class:`StoreQuota` is one virtual host's machine: the caller passes the
store size it measured and ``now``; :meth:`StoreQuota.observe` returns a
:class:`~rabbitflow_broker.events.StoreOverfull` (MST-1008) on the
UNDERFULL→OVERFULL transition and a
:class:`~rabbitflow_broker.events.StoreUnderfull` (MST-1009) on the way
back, once per transition.  The size is exceeded when ``size >
overfull_size`` and cleared when ``size < underfull_size``; between the two
the state stays as it is (hysteresis).  An ``overfull_size`` of 0 turns the
quota off; an ``underfull_size`` of 0 means "the overfull size".

The machine knows nothing about where the size comes from (RabbitMQ's
``message_bytes_persistent`` or the on-disk message store); that is the
caller's ``source``.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import Literal

from rabbitflow_broker.engine.errors import StateError
from rabbitflow_broker.events import StoreEvent, StoreOverfull, StoreUnderfull

__all__ = [
    "StoreQuota",
    "StoreSnapshot",
    "StoreSource",
    "StoreState",
    "StoreTransitionError",
    "validate_quota",
]

StoreSource = Literal["management", "disk"]


class StoreState(enum.Enum):
    """Whether the vhost's store is over its quota."""

    UNDERFULL = "underfull"
    OVERFULL = "overfull"


class _Trigger(enum.Enum):
    EXCEEDED = "exceeded"
    CLEARED = "cleared"


#: (state, trigger) -> next state; anything else is illegal.
TRANSITIONS: dict[tuple[StoreState, _Trigger], StoreState] = {
    (StoreState.UNDERFULL, _Trigger.EXCEEDED): StoreState.OVERFULL,
    (StoreState.OVERFULL, _Trigger.CLEARED): StoreState.UNDERFULL,
}


class StoreTransitionError(StateError):
    """An illegal move of the store machine; names the state and trigger."""

    def __init__(self, state: StoreState, trigger: str) -> None:
        super().__init__(f"store quota: no transition from {state.value} on {trigger}")
        self.state = state
        self.trigger = trigger


def validate_quota(overfull_size: int, underfull_size: int) -> None:
    """Check a quota pair.

    Raises:
        ValueError: a negative size, or an overfull size below the underfull size.
    """
    for name, value in (("overfull", overfull_size), ("underfull", underfull_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"store {name} size must be a non-negative integer, got {value!r}")
    if underfull_size > overfull_size:
        raise ValueError(
            f"store overfull size {overfull_size:,} is below the underfull size "
            f"{underfull_size:,}: producers could never be resumed"
        )


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """One vhost's store quota as the admin API and metrics show it."""

    vhost: str
    size: int
    overfull_size: int
    underfull_size: int
    overfull: bool
    source: StoreSource
    updated_at: str | None
    overfull_count: int

    def to_json(self) -> dict[str, object]:
        """Admin API shape."""
        return {
            "vhost": self.vhost,
            "size": self.size,
            "overfullSize": self.overfull_size,
            "underfullSize": self.underfull_size,
            "overfull": self.overfull,
            "source": self.source,
            "updatedAt": self.updated_at,
            "overfullCount": self.overfull_count,
        }


class StoreQuota:
    """The quota machine of one virtual host."""

    def __init__(
        self,
        vhost: str,
        overfull_size: int,
        underfull_size: int,
        *,
        source: StoreSource = "management",
    ) -> None:
        """Create it UNDERFULL.

        Raises:
            ValueError: see :func:`validate_quota`.
        """
        validate_quota(overfull_size, underfull_size)
        self.vhost = vhost
        self.overfull_size = overfull_size
        self.underfull_size = underfull_size or overfull_size
        self.source: StoreSource = source
        self.state = StoreState.UNDERFULL
        self.size = 0
        self.updated_at: dt.datetime | None = None
        self.overfull_count = 0

    @property
    def enabled(self) -> bool:
        """False when the overfull size is 0 (quota off)."""
        return self.overfull_size > 0

    @property
    def overfull(self) -> bool:
        """True while producers of the vhost must be blocked."""
        return self.state is StoreState.OVERFULL

    def _move(self, trigger: _Trigger) -> None:
        next_state = TRANSITIONS.get((self.state, trigger))
        if next_state is None:
            raise StoreTransitionError(self.state, trigger.value)
        self.state = next_state

    def observe(self, size: int, now: dt.datetime) -> StoreEvent | None:
        """Take a measured store size; return MST-1008/1009 on a transition.

        Raises:
            ValueError: a negative size.
        """
        if size < 0:
            raise ValueError(f"store size cannot be negative, got {size}")
        self.size = size
        self.updated_at = now
        if not self.enabled:
            return None
        fields = {
            "ts": now,
            "vhost": self.vhost,
            "size": size,
            "overfull_size": self.overfull_size,
            "underfull_size": self.underfull_size,
        }
        if self.state is StoreState.UNDERFULL and size > self.overfull_size:
            self._move(_Trigger.EXCEEDED)
            self.overfull_count += 1
            return StoreOverfull(**fields)  # type: ignore[arg-type]
        if self.state is StoreState.OVERFULL and size < self.underfull_size:
            self._move(_Trigger.CLEARED)
            return StoreUnderfull(**fields)  # type: ignore[arg-type]
        return None

    def snapshot(self) -> StoreSnapshot:
        """The admin API view."""
        return StoreSnapshot(
            vhost=self.vhost,
            size=self.size,
            overfull_size=self.overfull_size,
            underfull_size=self.underfull_size,
            overfull=self.overfull,
            source=self.source,
            updated_at=_iso_utc(self.updated_at) if self.updated_at else None,
            overfull_count=self.overfull_count,
        )


def _iso_utc(ts: dt.datetime) -> str:
    """``2026-11-22T06:43:00.000Z``: UTC, milliseconds, like the events' ``ts``."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
