"""The flow-control pause of one connection's reads (pure).

The back-pressure allowance is per connection
(:class:`~rabbitflow_broker.engine.allowance.Allowance`): publishes on flowed
channels spend it, and once it is spent the engine stops parsing after the
publish that spent it and pauses reading the client until
the allowance is renewed (every channel free again) or the pause ends.  A
channel still publishing past the enforcement timeout is closed; a
connection that ignores flow again soon after such a close is closed.

:class:`Pause` owns that state; the engine asks it and carries out what it
says (frames to send, channels to close).
"""

from __future__ import annotations

from collections.abc import Iterable

from rabbitflow_broker.engine import amqp_encode
from rabbitflow_broker.engine.allowance import Allowance, Verdict
from rabbitflow_broker.engine.channel import Channel

__all__ = ["Pause"]


class Pause:
    """The allowance of a connection, whether its reads pause for it, and
    where the scan of its bytes stops."""

    def __init__(self, enforcement: float | None) -> None:
        self.allowance = Allowance(enforcement)
        #: Reads are paused: the allowance is spent.
        self.paused = False
        #: The channel whose publish, once whole, ends the present scan.
        self.stop_after: int | None = None
        #: The last scan stopped at such a publish's end.
        self.halted = False
        #: The client takes Connection.Blocked / Unblocked (its capabilities say so).
        self.blocked_capable = False

    def until(self, channels: Iterable[Channel]) -> float | None:
        """When paused reads may resume (inf: once unflowed); None: nothing flowed."""
        return self.allowance.pause_until(
            c.flowed_at
            for c in channels
            if c.blockers and c.flowed_at is not None and not c.closed_by_gateway
        )

    def counted(self, number: int, size: int, now: float, channels: Iterable[Channel]) -> bytes:
        """A publish of ``size`` bytes on flowed channel ``number``: past the
        allowance, stop the scan after it and pause reads.  Returns the frame
        to tell the client so (Connection.Blocked), or ``b""``."""
        if not self.allowance.count(size):
            return b""
        until = self.until(channels)
        if until is None or until <= now:
            return b""
        self.stop_after = number
        if self.paused:
            return b""
        self.paused = True
        return amqp_encode.connection_blocked("flow control") if self.blocked_capable else b""

    def resume(self, now: float, channels: Iterable[Channel]) -> bytes | None:
        """End the pause if it may end: None while it holds, else the frame
        to tell the client (Connection.Unblocked, or ``b""``)."""
        until = self.until(channels)
        if until is not None and self.allowance.spent and until > now:
            return None
        self.paused = False
        return amqp_encode.CONNECTION_UNBLOCKED_FRAME if self.blocked_capable else b""

    def renew_if_free(self, channels: Iterable[Channel]) -> None:
        """Every channel unflowed: the allowance starts again."""
        if not any(channel.blockers for channel in channels):
            self.allowance.renew()

    def judge(self, now: float, channel: Channel) -> Verdict:
        """A publish on ``channel``: forward it, or close the channel or the
        connection for ignoring flow control."""
        if not channel.blockers:
            return Verdict.FORWARD
        return self.allowance.judge(now, channel.flowed_at)

    def next_scan(self) -> None:
        """A scan of the client's bytes begins."""
        self.halted = False
