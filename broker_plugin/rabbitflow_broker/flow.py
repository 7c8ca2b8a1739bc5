"""Per-queue flow thresholds and the overfull/underfull machine (pure).

* :class:`Thresholds` holds the four Qpid thresholds, validated on creation;
* :func:`thresholds_from_arguments` reads ``qpid.flow_*`` declare arguments;
* :func:`default_thresholds` derives thresholds from a queue's maximum
  (``x-max-length`` / ``x-max-length-bytes`` from arguments or policy) or
  the gateway's default queue limit, except for drop-head (ring) queues;
* :class:`QueueFlow` is the state machine: :meth:`QueueFlow.observe` takes
  the queue's depth and ``now`` and returns the QUE-1003/QUE-1004 events of
  its transitions.

A threshold of 0 is "not set".  A dimension whose stop value is not set
never stops the queue and always counts as satisfied for resuming.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from rabbitflow_broker.events import QueueOverfull, QueueUnderfull

__all__ = [
    "ARGUMENT_NAMES",
    "FlowInput",
    "FlowState",
    "IllegalTransition",
    "QueueFlow",
    "ThresholdError",
    "Thresholds",
    "ThresholdsSource",
    "default_thresholds",
    "thresholds_from_arguments",
]

STOP_COUNT: Final = "qpid.flow_stop_count"
RESUME_COUNT: Final = "qpid.flow_resume_count"
STOP_SIZE: Final = "qpid.flow_stop_size"
RESUME_SIZE: Final = "qpid.flow_resume_size"
#: The declare arguments, in the order of :class:`Thresholds` fields.
ARGUMENT_NAMES: Final = (STOP_COUNT, RESUME_COUNT, STOP_SIZE, RESUME_SIZE)

ThresholdsSource = Literal["arguments", "runtime", "default", "none"]


class ThresholdError(ValueError):
    """A threshold value is refused; the message names the argument."""

    def __init__(self, argument: str, reason: str) -> None:
        super().__init__(f"{argument}: {reason}")
        self.argument = argument
        self.reason = reason


def _check_value(name: str, value: object) -> int:
    # bool is an int subclass; True as a threshold is a client bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ThresholdError(name, f"must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ThresholdError(name, f"must be a non-negative integer, got {value}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    """The four thresholds of one queue; 0 means not set.

    Raises:
        ThresholdError: a negative or non-integer value, or a resume value
            above its stop value; the message names the argument.
    """

    stop_count: int = 0
    resume_count: int = 0
    stop_size: int = 0
    resume_size: int = 0

    def __post_init__(self) -> None:
        _check_value(STOP_COUNT, self.stop_count)
        _check_value(RESUME_COUNT, self.resume_count)
        _check_value(STOP_SIZE, self.stop_size)
        _check_value(RESUME_SIZE, self.resume_size)
        if self.resume_count > self.stop_count:
            raise ThresholdError(
                RESUME_COUNT,
                f"resume value {self.resume_count:,} is above the stop value "
                f"{STOP_COUNT}={self.stop_count:,}",
            )
        if self.resume_size > self.stop_size:
            raise ThresholdError(
                RESUME_SIZE,
                f"resume value {self.resume_size:,} is above the stop value "
                f"{STOP_SIZE}={self.stop_size:,}",
            )

    @property
    def enabled(self) -> bool:
        """False when neither stop value is set: the queue is never flowed."""
        return bool(self.stop_count or self.stop_size)

    def overfull(self, messages: int, size: int) -> bool:
        """True when a set stop value is exceeded."""
        return bool(
            (self.stop_count and messages > self.stop_count)
            or (self.stop_size and size > self.stop_size)
        )

    def underfull(self, messages: int, size: int) -> bool:
        """True when every set dimension is below its resume value."""
        count_ok = not self.stop_count or messages < self.resume_count
        size_ok = not self.stop_size or size < self.resume_size
        return count_ok and size_ok

    def to_json(self) -> dict[str, int]:
        """The admin API's camelCase keys."""
        return {
            "flowStopCount": self.stop_count,
            "flowResumeCount": self.resume_count,
            "flowStopSize": self.stop_size,
            "flowResumeSize": self.resume_size,
        }


DISABLED: Final = Thresholds()


def _derived_resume(stop: int, stop_pct: int, resume_pct: int) -> int:
    # Like Qpid C++, an unset resume value follows the stop value at the
    # broker-wide resume/stop ratio, so a queue with only a stop value still
    # has hysteresis.
    if not stop:
        return 0
    if stop_pct and resume_pct:
        return stop * resume_pct // stop_pct
    return stop


def thresholds_from_arguments(
    arguments: Mapping[str, object] | None, *, stop_pct: int = 80, resume_pct: int = 70
) -> Thresholds | None:
    """Thresholds named by ``qpid.flow_*`` arguments, or None if there are none.

    Strings holding integers are refused like any other non-integer: AMQP
    tables carry integers natively and a string is a client bug.

    Raises:
        ThresholdError: an invalid value; the message names the argument.
    """
    if not arguments or not any(name in arguments for name in ARGUMENT_NAMES):
        return None
    values = {name: _check_value(name, arguments.get(name, 0)) for name in ARGUMENT_NAMES}
    stop_count, stop_size = values[STOP_COUNT], values[STOP_SIZE]
    resume_count = values[RESUME_COUNT]
    resume_size = values[RESUME_SIZE]
    if RESUME_COUNT not in arguments:
        resume_count = _derived_resume(stop_count, stop_pct, resume_pct)
    if RESUME_SIZE not in arguments:
        resume_size = _derived_resume(stop_size, stop_pct, resume_pct)
    return Thresholds(
        stop_count=stop_count,
        resume_count=resume_count,
        stop_size=stop_size,
        resume_size=resume_size,
    )


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _limit(arguments: Mapping[str, object], policy: Mapping[str, object], key: str) -> int | None:
    # RabbitMQ applies the lower of the argument and the policy value.
    values = [
        v
        for v in (_int_or_none(arguments.get("x-" + key)), _int_or_none(policy.get(key)))
        if v is not None
    ]
    return min(values) if values else None


def default_thresholds(
    arguments: Mapping[str, object] | None,
    policy: Mapping[str, object] | None,
    *,
    stop_pct: int,
    resume_pct: int,
    default_queue_limit: int,
) -> Thresholds | None:
    """Default thresholds of a queue without ``qpid.flow_*`` arguments.

    Returns None when the queue gets no defaults: both broker percentages
    are 0, its overflow is drop-head (RabbitMQ's default when a maximum is
    set), or it has no maximum and the default queue limit is 0.
    """
    if not stop_pct and not resume_pct:
        return None
    arguments = arguments or {}
    policy = policy or {}
    max_length = _limit(arguments, policy, "max-length")
    max_bytes = _limit(arguments, policy, "max-length-bytes")
    if max_length is not None or max_bytes is not None:
        overflow = arguments.get("x-overflow", policy.get("overflow", "drop-head"))
        if isinstance(overflow, bytes):
            overflow = overflow.decode()
        if overflow == "drop-head":
            return None
        base_count, base_size = max_length or 0, max_bytes or 0
    elif default_queue_limit:
        base_count, base_size = 0, default_queue_limit
    else:
        return None
    stop_count = base_count * stop_pct // 100
    stop_size = base_size * stop_pct // 100
    return Thresholds(
        stop_count=stop_count,
        resume_count=min(stop_count, base_count * resume_pct // 100),
        stop_size=stop_size,
        resume_size=min(stop_size, base_size * resume_pct // 100),
    )


class FlowState(enum.Enum):
    """Whether the queue's producers are flowed (ON) or not (OFF)."""

    OFF = "off"
    ON = "on"


class FlowInput(enum.Enum):
    """What an observation of the depth amounts to."""

    OVERFULL = "overfull"
    UNDERFULL = "underfull"


class IllegalTransition(RuntimeError):
    """A (state, input) pair the transition table does not allow."""

    def __init__(self, state: FlowState, event: FlowInput) -> None:
        super().__init__(f"no transition from {state.name} on {event.name}")
        self.state = state
        self.event = event


TRANSITIONS: Final[Mapping[tuple[FlowState, FlowInput], FlowState]] = {
    (FlowState.OFF, FlowInput.OVERFULL): FlowState.ON,
    (FlowState.ON, FlowInput.UNDERFULL): FlowState.OFF,
}


class QueueFlow:
    """The threshold machine of one queue.

    Starts OFF.  :meth:`observe` moves OFF→ON when a stop threshold is
    exceeded and ON→OFF when every resume condition holds, returning the
    event of the transition (at most one per call).
    """

    def __init__(self, vhost: str, queue: str, thresholds: Thresholds = DISABLED) -> None:
        self.vhost = vhost
        self.queue = queue
        self.thresholds = thresholds
        self.state = FlowState.OFF
        self.flow_stopped_count = 0
        self._stopped_total = dt.timedelta(0)
        self._stopped_since: dt.datetime | None = None

    @property
    def stopped(self) -> bool:
        """True while the queue is overfull (flow ON)."""
        return self.state is FlowState.ON

    def stopped_seconds(self, now: dt.datetime) -> float:
        """Seconds spent ON so far, the current ON period counted up to ``now``."""
        total = self._stopped_total
        if self._stopped_since is not None:
            total += max(now - self._stopped_since, dt.timedelta(0))
        return total.total_seconds()

    def _move(self, event: FlowInput) -> None:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(self.state, event) from None

    def observe(
        self, messages: int, size: int, now: dt.datetime
    ) -> QueueOverfull | QueueUnderfull | None:
        """Feed the current depth; return the event of a transition, if any."""
        t = self.thresholds
        if self.state is FlowState.OFF:
            if not t.overfull(messages, size):
                return None
            self._move(FlowInput.OVERFULL)
            self.flow_stopped_count += 1
            self._stopped_since = now
            return QueueOverfull(
                ts=now,
                vhost=self.vhost,
                queue=self.queue,
                size=size,
                capacity=t.stop_size,
                messages=messages,
                message_capacity=t.stop_count,
            )
        if not t.underfull(messages, size):
            return None
        self._move(FlowInput.UNDERFULL)
        if self._stopped_since is not None:
            self._stopped_total += max(now - self._stopped_since, dt.timedelta(0))
            self._stopped_since = None
        return QueueUnderfull(
            ts=now,
            vhost=self.vhost,
            queue=self.queue,
            size=size,
            resume_capacity=t.resume_size,
            messages=messages,
            message_capacity=t.resume_count,
        )
