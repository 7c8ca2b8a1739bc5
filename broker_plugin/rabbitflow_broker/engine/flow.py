"""Per-queue flow thresholds and the overfull/underfull machine (pure).

* :class:`Thresholds` holds the four Qpid thresholds, validated on creation;
* :func:`thresholds_from_arguments` reads ``qpid.flow_*`` declare arguments;
* :func:`default_thresholds` derives thresholds from a queue's maximum
  (``x-max-length`` / ``x-max-length-bytes`` from arguments or policy,
  Qpid's ``qpid.max_count`` / ``qpid.max_size``) or the gateway's default
  queue limit, except for drop-head (ring) queues and streams;
* :func:`with_derived_resume` fills in every resume value that is not set
  beside a set stop value; every source of thresholds goes through it, so
  no combination of values can leave an empty queue flow-stopped;
* :class:`QueueFlow` is the state machine: :meth:`QueueFlow.observe` takes
  the queue's depth and ``now`` and returns the QUE-1003/QUE-1004 events of
  its transitions.

A threshold of 0 is "not set".  A dimension whose stop value is not set
never stops the queue and always counts as satisfied for resuming; a
resume value that is not set beside a set stop value is derived from it
(stop * resume% / stop%, at least 1).

Streams are governed by retention, not by consumers: they get no default
thresholds and ``qpid.flow_*`` arguments on them are refused.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from rabbitflow_broker.engine.errors import StateError, UsageError
from rabbitflow_broker.events import QueueOverfull, QueueUnderfull

__all__ = [
    "ARGUMENT_NAMES",
    "MAX_THRESHOLD",
    "FlowInput",
    "FlowState",
    "IllegalTransition",
    "QueueFlow",
    "ThresholdError",
    "Thresholds",
    "ThresholdsSource",
    "check_value",
    "default_thresholds",
    "derived_resume",
    "is_stream",
    "thresholds_from_arguments",
    "with_derived_resume",
]

STOP_COUNT: Final = "qpid.flow_stop_count"
RESUME_COUNT: Final = "qpid.flow_resume_count"
STOP_SIZE: Final = "qpid.flow_stop_size"
RESUME_SIZE: Final = "qpid.flow_resume_size"
#: The declare arguments, in the order of :class:`Thresholds` fields.
ARGUMENT_NAMES: Final = (STOP_COUNT, RESUME_COUNT, STOP_SIZE, RESUME_SIZE)

ThresholdsSource = Literal["arguments", "runtime", "default", "none"]


#: The largest threshold: AMQP's signed long-long, what a queue argument carries.
MAX_THRESHOLD = (1 << 63) - 1


class ThresholdError(UsageError, ValueError):
    """A threshold value is refused; the message names the argument."""

    def __init__(self, argument: str, reason: str) -> None:
        super().__init__(f"{argument}: {reason}")
        self.argument = argument
        self.reason = reason


def check_value(name: str, value: object) -> int:
    """``value`` as a threshold named ``name``.

    Raises:
        ThresholdError: not an integer in 0 .. 2**63-1 (AMQP's long-long, the
            largest count or size a queue argument can carry).
    """
    # bool is an int subclass; True as a threshold is a client bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ThresholdError(name, f"must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ThresholdError(name, f"must be a non-negative integer, got {value}")
    if value > MAX_THRESHOLD:
        raise ThresholdError(name, f"must be at most {MAX_THRESHOLD}, got {len(str(value))} digits")
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
        check_value(STOP_COUNT, self.stop_count)
        check_value(RESUME_COUNT, self.resume_count)
        check_value(STOP_SIZE, self.stop_size)
        check_value(RESUME_SIZE, self.resume_size)
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


#: The resume/stop ratio used when a broker percentage is 0 (not set):
#: the gateway's (and Qpid C++'s) defaults, 70% and 80%.
_FALLBACK_RESUME_PCT: Final = 70
_FALLBACK_STOP_PCT: Final = 80


def derived_resume(stop: int, *, stop_pct: int, resume_pct: int) -> int:
    """The resume value that goes with a stop value whose resume is not set.

    ``stop * resume_pct // stop_pct`` (70/80 when either percentage is 0),
    never below 1 and never above ``stop``: a queue that is empty always
    satisfies it.  0 for a stop value that is not set.
    """
    if stop <= 0:
        return 0
    if not (stop_pct and resume_pct):
        stop_pct, resume_pct = _FALLBACK_STOP_PCT, _FALLBACK_RESUME_PCT
    return min(stop, max(1, stop * resume_pct // stop_pct))


def with_derived_resume(thresholds: Thresholds, *, stop_pct: int, resume_pct: int) -> Thresholds:
    """``thresholds`` with each resume of 0 beside a non-zero stop derived from it.

    Like Qpid C++, an unset resume value follows the stop value at the
    broker-wide resume/stop ratio, so a queue with only a stop value still
    has hysteresis and, above all, resumes once it drains.
    """
    resume_count, resume_size = thresholds.resume_count, thresholds.resume_size
    if thresholds.stop_count and not resume_count:
        resume_count = derived_resume(
            thresholds.stop_count, stop_pct=stop_pct, resume_pct=resume_pct
        )
    if thresholds.stop_size and not resume_size:
        resume_size = derived_resume(thresholds.stop_size, stop_pct=stop_pct, resume_pct=resume_pct)
    if (resume_count, resume_size) == (thresholds.resume_count, thresholds.resume_size):
        return thresholds
    return Thresholds(
        stop_count=thresholds.stop_count,
        resume_count=resume_count,
        stop_size=thresholds.stop_size,
        resume_size=resume_size,
    )


def _text(value: object) -> object:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def is_stream(arguments: Mapping[str, object] | None) -> bool:
    """True when the declare arguments make the queue a stream (``x-queue-type``)."""
    return bool(arguments) and _text(arguments.get("x-queue-type")) == "stream"  # type: ignore[union-attr]


def thresholds_from_arguments(
    arguments: Mapping[str, object] | None, *, stop_pct: int = 80, resume_pct: int = 70
) -> Thresholds | None:
    """Thresholds named by ``qpid.flow_*`` arguments, or None if there are none.

    Strings holding integers are refused like any other non-integer: AMQP
    tables carry integers natively and a string is a client bug.  A resume
    value absent or 0 beside a non-zero stop value is derived
    (:func:`derived_resume`).

    Raises:
        ThresholdError: an invalid value, or any ``qpid.flow_*`` argument
            on a stream; the message names the argument.
    """
    if not arguments or not any(name in arguments for name in ARGUMENT_NAMES):
        return None
    if is_stream(arguments):
        name = next(name for name in ARGUMENT_NAMES if name in arguments)
        raise ThresholdError(
            name,
            "flow thresholds do not apply to a stream (x-queue-type=stream): consuming "
            "removes nothing from a stream, so its producers could never resume; "
            "bound a stream with x-max-length-bytes / x-max-age retention instead",
        )
    values = {name: check_value(name, arguments.get(name, 0)) for name in ARGUMENT_NAMES}
    return with_derived_resume(
        Thresholds(
            stop_count=values[STOP_COUNT],
            resume_count=values[RESUME_COUNT],
            stop_size=values[STOP_SIZE],
            resume_size=values[RESUME_SIZE],
        ),
        stop_pct=stop_pct,
        resume_pct=resume_pct,
    )


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _limit(
    arguments: Mapping[str, object], policy: Mapping[str, object], key: str, qpid_key: str
) -> int | None:
    # RabbitMQ applies the lower of the argument and the policy value; Qpid's
    # own argument is one more maximum of the same kind.
    values = [
        v
        for v in (
            _int_or_none(arguments.get("x-" + key)),
            _int_or_none(policy.get(key)),
            _int_or_none(arguments.get(qpid_key)),
        )
        if v is not None
    ]
    return min(values) if values else None


#: Qpid's ``qpid.policy_type`` values that discard old messages (no defaults).
_QPID_RING_POLICIES: Final = frozenset({"ring", "ring_strict"})


def _drops_head(arguments: Mapping[str, object], policy: Mapping[str, object]) -> bool:
    """Whether a bounded queue discards its oldest messages when full."""
    rabbit_max = any(
        _int_or_none(value) is not None
        for value in (
            arguments.get("x-max-length"),
            arguments.get("x-max-length-bytes"),
            policy.get("max-length"),
            policy.get("max-length-bytes"),
        )
    )
    # RabbitMQ's overflow default is drop-head; a queue bounded only by
    # Qpid's qpid.max_count/qpid.max_size follows Qpid's default, reject.
    default = "drop-head" if rabbit_max else "reject-publish"
    return _text(arguments.get("x-overflow", policy.get("overflow", default))) == "drop-head"


def default_thresholds(
    arguments: Mapping[str, object] | None,
    policy: Mapping[str, object] | None,
    *,
    stop_pct: int,
    resume_pct: int,
    default_queue_limit: int,
) -> Thresholds | None:
    """Default thresholds of a queue without ``qpid.flow_*`` arguments.

    The queue's maximum is the lowest of ``x-max-length`` (bytes:
    ``x-max-length-bytes``), the policy's ``max-length``
    (``max-length-bytes``) and Qpid's ``qpid.max_count`` (``qpid.max_size``).
    Returns None when the queue gets no defaults: both broker percentages
    are 0, it is a stream, its overflow is drop-head (RabbitMQ's default
    when its own maximum is set; ``qpid.policy_type=ring``), or it has no
    maximum and the default queue limit is 0.
    """
    if not stop_pct and not resume_pct:
        return None
    arguments = arguments or {}
    policy = policy or {}
    if is_stream(arguments):
        return None
    max_length = _limit(arguments, policy, "max-length", "qpid.max_count")
    max_bytes = _limit(arguments, policy, "max-length-bytes", "qpid.max_size")
    if _text(arguments.get("qpid.policy_type")) in _QPID_RING_POLICIES:
        return None
    if max_length is not None or max_bytes is not None:
        if _drops_head(arguments, policy):
            return None
        base_count, base_size = max_length or 0, max_bytes or 0
    elif default_queue_limit:
        base_count, base_size = 0, default_queue_limit
    else:
        return None
    stop_count = base_count * stop_pct // 100
    stop_size = base_size * stop_pct // 100
    return with_derived_resume(
        Thresholds(
            stop_count=stop_count,
            resume_count=min(stop_count, base_count * resume_pct // 100),
            stop_size=stop_size,
            resume_size=min(stop_size, base_size * resume_pct // 100),
        ),
        stop_pct=stop_pct,
        resume_pct=resume_pct,
    )


class FlowState(enum.Enum):
    """Whether the queue's producers are flowed (ON) or not (OFF)."""

    OFF = "off"
    ON = "on"


class FlowInput(enum.Enum):
    """What an observation of the depth amounts to."""

    OVERFULL = "overfull"
    UNDERFULL = "underfull"


class IllegalTransition(StateError):
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

    def force(self, state: FlowState, now: dt.datetime) -> None:
        """Take a state decided elsewhere (a cluster's owner), without an
        event; flowStoppedCount counts each OFF to ON."""
        if state is self.state:
            return
        self.state = state
        if state is FlowState.ON:
            self.flow_stopped_count += 1
            self._stopped_since = now
        elif self._stopped_since is not None:
            self._stopped_total += max(now - self._stopped_since, dt.timedelta(0))
            self._stopped_since = None

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
