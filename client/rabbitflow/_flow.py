"""Producer-side flow control, sans-IO: the gate, the window and send waits.

Nothing here touches sockets, threads, pika, logging or the clock: the
driver (``_producer.py``) passes ``now`` (seconds, monotonic) in and carries
out what comes back.

* ``FlowGate`` - may the producer publish?  Enum states, transitions as data
  (``GATE_TRANSITIONS``); an illegal move raises ``IllegalTransitionError``.
* ``ProducerWindow`` - the messages a producer accepted and the broker has not
  confirmed: queued (not on the wire), unconfirmed (keyed by delivery tag),
  and nacked ones awaiting re-send in their original order with backoff.
* ``SendWait`` - the bookkeeping of one blocked ``send()``: when to warn
  ("delayed by Ns"), when to give up.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from ._exceptions import IllegalStateError

__all__ = [
    "GATE_TRANSITIONS",
    "ConnectionBlocked",
    "ConnectionUnblocked",
    "FlowEnforced",
    "FlowGate",
    "FlowRemoved",
    "Gate",
    "GateEvent",
    "IllegalTransitionError",
    "ProducerWindow",
    "SendDelayed",
    "SendFailed",
    "SendWait",
]

T = TypeVar("T")


# --------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class FlowEnforced:
    """The broker sent Channel.Flow(active=false) to the producer's channel."""


@dataclass(frozen=True, slots=True)
class FlowRemoved:
    """The broker sent Channel.Flow(active=true) after a FlowEnforced."""


@dataclass(frozen=True, slots=True)
class ConnectionBlocked:
    """The broker sent connection.blocked (a resource alarm)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionUnblocked:
    """The broker sent connection.unblocked."""


@dataclass(frozen=True, slots=True)
class SendDelayed:
    """A send has waited ``waited_ms`` (a multiple of the notify period)."""

    waited_ms: int

    @property
    def seconds(self) -> int:
        """Whole seconds waited, as printed in the warning."""
        return self.waited_ms // 1000


@dataclass(frozen=True, slots=True)
class SendFailed:
    """A send gave up after ``waited_ms`` (the wait-failure time)."""

    waited_ms: int


GateNotice = FlowEnforced | FlowRemoved | ConnectionBlocked | ConnectionUnblocked


# ----------------------------------------------------------------------- gate
class Gate(enum.Enum):
    """Whether a producer may publish."""

    OPEN = "open"
    FLOWED = "flowed"  # Channel.Flow(active=false) on its channel
    BLOCKED = "blocked"  # connection.blocked
    FLOWED_BLOCKED = "flowed+blocked"
    DISCONNECTED = "disconnected"  # connection lost, recovery running
    # ... and the new connection, the producer's channel not reopened yet on
    # it, is blocked: the producer comes back BLOCKED
    DISCONNECTED_BLOCKED = "disconnected+blocked"
    CLOSED = "closed"


class GateEvent(enum.Enum):
    """What can happen to a producer's gate."""

    FLOW_OFF = "flow_off"  # Channel.Flow(active=false)
    FLOW_ON = "flow_on"  # Channel.Flow(active=true)
    BLOCKED = "blocked"
    UNBLOCKED = "unblocked"
    CONNECTION_LOST = "connection_lost"
    RECONNECTED = "reconnected"
    CLOSE = "close"


_G, _E = Gate, GateEvent
GATE_TRANSITIONS: dict[tuple[Gate, GateEvent], Gate] = {
    (_G.OPEN, _E.FLOW_OFF): _G.FLOWED,
    (_G.OPEN, _E.FLOW_ON): _G.OPEN,
    (_G.OPEN, _E.BLOCKED): _G.BLOCKED,
    (_G.OPEN, _E.UNBLOCKED): _G.OPEN,
    (_G.FLOWED, _E.FLOW_OFF): _G.FLOWED,
    (_G.FLOWED, _E.FLOW_ON): _G.OPEN,
    (_G.FLOWED, _E.BLOCKED): _G.FLOWED_BLOCKED,
    (_G.FLOWED, _E.UNBLOCKED): _G.FLOWED,
    (_G.BLOCKED, _E.FLOW_OFF): _G.FLOWED_BLOCKED,
    (_G.BLOCKED, _E.FLOW_ON): _G.BLOCKED,
    (_G.BLOCKED, _E.BLOCKED): _G.BLOCKED,
    (_G.BLOCKED, _E.UNBLOCKED): _G.OPEN,
    (_G.FLOWED_BLOCKED, _E.FLOW_OFF): _G.FLOWED_BLOCKED,
    (_G.FLOWED_BLOCKED, _E.FLOW_ON): _G.BLOCKED,
    (_G.FLOWED_BLOCKED, _E.BLOCKED): _G.FLOWED_BLOCKED,
    (_G.FLOWED_BLOCKED, _E.UNBLOCKED): _G.FLOWED,
    (_G.DISCONNECTED, _E.RECONNECTED): _G.OPEN,
    (_G.DISCONNECTED, _E.CONNECTION_LOST): _G.DISCONNECTED,
    # connection.blocked / unblocked of the new connection while recovery
    # restores it, before the producer's channel is reopened on it.
    (_G.DISCONNECTED, _E.BLOCKED): _G.DISCONNECTED_BLOCKED,
    (_G.DISCONNECTED, _E.UNBLOCKED): _G.DISCONNECTED,
    (_G.DISCONNECTED_BLOCKED, _E.BLOCKED): _G.DISCONNECTED_BLOCKED,
    (_G.DISCONNECTED_BLOCKED, _E.UNBLOCKED): _G.DISCONNECTED,
    (_G.DISCONNECTED_BLOCKED, _E.RECONNECTED): _G.BLOCKED,
    # The next connection starts unblocked.
    (_G.DISCONNECTED_BLOCKED, _E.CONNECTION_LOST): _G.DISCONNECTED,
}
# A connection can be lost, or the producer closed, from every live state.
for _state in (_G.OPEN, _G.FLOWED, _G.BLOCKED, _G.FLOWED_BLOCKED):
    GATE_TRANSITIONS[(_state, _E.CONNECTION_LOST)] = _G.DISCONNECTED
for _state in Gate:
    GATE_TRANSITIONS[(_state, _E.CLOSE)] = _G.CLOSED

_FLOWED_STATES = frozenset({Gate.FLOWED, Gate.FLOWED_BLOCKED})
_BLOCKED_STATES = frozenset({Gate.BLOCKED, Gate.FLOWED_BLOCKED, Gate.DISCONNECTED_BLOCKED})
_DISCONNECTED_STATES = frozenset({Gate.DISCONNECTED, Gate.DISCONNECTED_BLOCKED})
_SIGNAL_STATES = _FLOWED_STATES | _BLOCKED_STATES


class IllegalTransitionError(IllegalStateError):
    """An event that cannot happen in the current state."""

    def __init__(self, state: Gate, event: GateEvent) -> None:
        super().__init__(f"event {event.name} is not allowed in state {state.name}")
        self.state = state
        self.event = event


class FlowGate:
    """The producer's gate state machine (see ``GATE_TRANSITIONS``)."""

    def __init__(self, state: Gate = Gate.OPEN) -> None:
        self.state = state

    @property
    def is_open(self) -> bool:
        """True when the producer may publish."""
        return self.state is Gate.OPEN

    @property
    def disconnected(self) -> bool:
        """True while the producer has no channel (recovery running)."""
        return self.state in _DISCONNECTED_STATES

    @property
    def flowed(self) -> bool:
        """True while the broker has flowed the producer's channel."""
        return self.state in _FLOWED_STATES

    def handle(self, event: GateEvent, reason: str = "") -> list[GateNotice]:
        """Apply ``event``; return the notices the transition produces.

        Raises:
            IllegalTransitionError: ``event`` cannot happen in this state.
        """
        old = self.state
        try:
            new = GATE_TRANSITIONS[(old, event)]
        except KeyError:
            raise IllegalTransitionError(old, event) from None
        self.state = new
        notices: list[GateNotice] = []
        if old not in _FLOWED_STATES and new in _FLOWED_STATES:
            notices.append(FlowEnforced())
        elif old in _FLOWED_STATES and new not in _FLOWED_STATES and new is not Gate.CLOSED:
            notices.append(FlowRemoved())
        if old not in _BLOCKED_STATES and new in _BLOCKED_STATES:
            notices.append(ConnectionBlocked(reason))
        elif old in _BLOCKED_STATES and new not in _BLOCKED_STATES and new is not Gate.CLOSED:
            notices.append(ConnectionUnblocked())
        return notices


# --------------------------------------------------------------------- window
class Publish(NamedTuple, Generic[T]):
    """An instruction to publish ``item`` now; it will carry delivery tag ``tag``.

    A named tuple: one is built per published message, and a tuple costs a
    third of a frozen dataclass to build.

    ``resent``: published before on a connection that was lost before its
    confirm came; the broker may hold it already, so the driver flags it as
    redelivered.
    """

    tag: int
    seq: int
    item: T
    resent: bool = False


@dataclass(frozen=True, slots=True)
class Confirmed(Generic[T]):
    """``item`` (send number ``seq``) was confirmed by the broker."""

    seq: int
    item: T


class ProducerWindow(Generic[T]):
    """Messages accepted by a producer and not yet confirmed, in send order.

    Every accepted message has a send number ``seq`` (1, 2, ...).  It is
    *queued* until the driver publishes it (``take``), then *unconfirmed*
    under the delivery tag this class assigned (1, 2, ... per channel, as
    the broker numbers confirms) until the broker acks it.  A nacked message
    goes back to the queue and the window enters *retry*: nothing new is
    accepted, and queued messages go out one at a time, each only once the
    previous is confirmed and the backoff has passed, so re-sends keep the
    original order.  Retry ends once every nacked message is confirmed.
    """

    def __init__(
        self,
        capacity: int,
        *,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.gate = FlowGate()
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._backoff = backoff_initial
        self._queued: list[tuple[int, T]] = []  # heap by seq
        self._unconfirmed: dict[int, tuple[int, T]] = {}  # tag -> (seq, item)
        self._retry: set[int] = set()  # seqs nacked and not yet confirmed
        self._resend: set[int] = set()  # seqs queued again after a connection loss
        self._resend_at = 0.0
        self._next_seq = 1
        self._next_tag = 1
        self.accepted_count = 0
        self.confirmed_count = 0
        self.nacked_count = 0
        self.resent_count = 0  # re-published after a connection loss: may be duplicates

    # ------------------------------------------------------------ queries
    @property
    def in_flight(self) -> int:
        """Messages accepted and not yet confirmed."""
        return len(self._queued) + len(self._unconfirmed)

    @property
    def retrying(self) -> bool:
        """True while nacked messages await re-send."""
        return bool(self._retry)

    @property
    def idle(self) -> bool:
        """True when everything accepted has been confirmed."""
        return self.in_flight == 0

    @property
    def last_accepted(self) -> int:
        """The send number of the last message accepted (0: none yet)."""
        return self._next_seq - 1

    def published_through(self, seq: int) -> bool:
        """True when every message accepted up to send number ``seq`` is
        published and confirmed (what came after may still be queued)."""
        if self._queued and self._queued[0][0] <= seq:
            return False
        return all(s > seq for s, _ in self._unconfirmed.values())

    def can_accept(self) -> bool:
        """True when ``accept`` would not have to wait."""
        return self.gate.is_open and not self._retry and self.in_flight < self.capacity

    @property
    def flow_signalled(self) -> bool:
        """True while the broker holds the producer back: Channel.Flow off,
        connection.blocked (also of the connection recovery is restoring), or
        nacked messages awaiting re-send.  A window that is merely full, or a
        lost connection, is not a flow signal."""
        return self.gate.state in _SIGNAL_STATES or bool(self._retry)

    def wait_reason(self) -> str:
        """Why a send has to wait ("" when it does not)."""
        if not self.gate.is_open:
            return self.gate.state.value
        if self._retry:
            return "nacked"
        if self.in_flight >= self.capacity:
            return "window_full"
        return ""

    def publish_due(self) -> float | None:
        """When ``take`` will next return something, else None.

        None while the gate is shut, nothing is queued, or (in retry) a
        re-sent message awaits its confirm; the backoff end in retry; 0.0
        (at once) otherwise.  The driver asks after every confirm and every
        ``take``: a message accepted while a nack arrived stays queued when
        its own publish turn found the window in retry, and only this
        answer tells the driver to publish it once the retry ends.
        """
        if not self._queued or not self.gate.is_open:  # after a take: nothing queued
            return None
        if self._retry:
            return None if self._unconfirmed else self._resend_at
        return 0.0

    def resend_due(self) -> float | None:
        """When queued messages can next be published in retry, else None."""
        if not self._retry:
            return None
        return self.publish_due()

    # ------------------------------------------------------------ actions
    def accept(self, item: T) -> int:
        """Take ``item`` into the window; return its send number.

        Raises:
            IllegalStateError: ``can_accept()`` is false.
        """
        if not self.can_accept():
            raise IllegalStateError(f"window cannot accept now ({self.wait_reason()})")
        seq = self._next_seq
        self._next_seq += 1
        heapq.heappush(self._queued, (seq, item))
        self.accepted_count += 1
        return seq

    def take(self, now: float, limit: int | None = None) -> list[Publish[T]]:
        """What to publish now, in order, with the delivery tags it will get:
        at most ``limit`` (the rest stays queued and ``publish_due`` says so)."""
        if not self.gate.is_open or not self._queued:
            return []
        if self._retry:
            if self._unconfirmed or now < self._resend_at:
                return []
            count = 1
        else:
            count = len(self._queued) if limit is None else min(len(self._queued), limit)
        out: list[Publish[T]] = []
        resend = self._resend
        for _ in range(count):
            seq, item = heapq.heappop(self._queued)
            tag = self._next_tag
            self._next_tag += 1
            self._unconfirmed[tag] = (seq, item)
            if resend and seq in resend:
                resend.discard(seq)
                out.append(Publish(tag, seq, item, True))
            else:
                out.append(Publish(tag, seq, item))
        return out

    def _tags(self, tag: int, multiple: bool) -> list[int]:
        if not multiple:
            return [tag] if tag in self._unconfirmed else []
        # Tags are inserted in increasing order: stop at the first later one.
        tags: list[int] = []
        for t in self._unconfirmed:
            if t > tag:
                break
            tags.append(t)
        return tags

    def ack(self, tag: int, multiple: bool) -> list[Confirmed[T]]:
        """The broker confirmed ``tag`` (and every earlier one if ``multiple``)."""
        done: list[Confirmed[T]] = []
        for t in self._tags(tag, multiple):
            seq, item = self._unconfirmed.pop(t)
            if seq in self._retry:
                self._retry.discard(seq)
                self._backoff = self._backoff_initial
            done.append(Confirmed(seq, item))
        self.confirmed_count += len(done)
        return done

    def nack(self, tag: int, multiple: bool, now: float) -> int:
        """The broker refused ``tag`` (and earlier ones if ``multiple``): re-send later.

        Returns how many messages were nacked.
        """
        tags = self._tags(tag, multiple)
        for t in tags:
            seq, item = self._unconfirmed.pop(t)
            heapq.heappush(self._queued, (seq, item))
            self._retry.add(seq)
        if tags:
            self.nacked_count += len(tags)
            self._resend_at = now + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_max)
        return len(tags)

    def handle(self, event: GateEvent, reason: str = "") -> list[GateNotice]:
        """Feed a gate event; a connection loss queues unconfirmed messages again.

        Raises:
            IllegalTransitionError: ``event`` cannot happen in this state.
        """
        notices = self.gate.handle(event, reason)
        if event is GateEvent.CONNECTION_LOST:
            # Their confirms are lost with the channel: publish them again on
            # the next one.  The broker may hold them already: these are the
            # only messages that can be duplicated.
            for seq, item in self._unconfirmed.values():
                heapq.heappush(self._queued, (seq, item))
                self._resend.add(seq)
            self.resent_count += len(self._unconfirmed)
            self._unconfirmed.clear()
            self._next_tag = 1
        return notices

    def drop_queued(self) -> int:
        """Remove what is accepted and not yet published (a transaction being
        rolled back discards it); return how many.  What is published stays
        (the broker discards it with the transaction, or confirms it); the
        dropped ones leave the retry and the re-send marks too, so that a
        retry does not wait for a confirm that cannot come."""
        dropped = [seq for seq, _ in self._queued]
        self._queued.clear()
        self._retry.difference_update(dropped)
        self._resend.difference_update(dropped)
        if not self._retry:
            self._backoff = self._backoff_initial  # as a confirmed re-send does
        return len(dropped)

    def drain(self) -> list[T]:
        """Remove and return everything not confirmed, in send order (for a failed close)."""
        items = sorted([*self._queued, *self._unconfirmed.values()], key=lambda p: p[0])
        self._queued.clear()
        self._unconfirmed.clear()
        self._retry.clear()
        self._resend.clear()
        return [item for _, item in items]


# ----------------------------------------------------------------------- wait
@dataclass(frozen=True, slots=True)
class WaitStep:
    """What a waiting send should do now."""

    notices: tuple[SendDelayed, ...]
    failed: SendFailed | None
    wake_at: float  # when to call poll again at the latest


class SendWait:
    """One blocked send: warn every notify period, fail at the wait-failure time."""

    def __init__(self, start: float, *, notify_period_ms: int, wait_failure_ms: int) -> None:
        self.start = start
        self.notify_period_ms = notify_period_ms
        self.wait_failure_ms = wait_failure_ms
        self._notified = 0  # notify periods already reported

    def poll(self, now: float) -> WaitStep:
        """Advance to ``now``: the warnings due, whether the send has failed."""
        waited_ms = int(round((now - self.start) * 1000, 6))
        if waited_ms >= self.wait_failure_ms:
            return WaitStep((), SendFailed(self.wait_failure_ms), now)
        notices: list[SendDelayed] = []
        period = self.notify_period_ms
        if period > 0:
            due = waited_ms // period
            while self._notified < due:
                self._notified += 1
                notices.append(SendDelayed(self._notified * period))
            next_ms = min((self._notified + 1) * period, self.wait_failure_ms)
        else:
            next_ms = self.wait_failure_ms
        return WaitStep(tuple(notices), None, self.start + next_ms / 1000)
