"""What a connection may still publish while it ignores flow control (pure).

SPEC: a client that ignores ``Channel.Flow(active=false)`` gains nothing by
tricks.  The back-pressure allowance (:data:`PAUSE_MESSAGES` messages or
:data:`PAUSE_BYTES` body bytes published on flowed channels) belongs to the
*connection*: it is summed over all its channels and kept across channel
close and reopen, and only a real unblock (every channel unflowed) renews
it.  Past it, the connection's reads pause until its flowed channels reach
their enforcement timeout; a channel still publishing then is closed
(CHN-1012), and a connection that does it again within
:data:`REPEAT_OFFENCE_S` is closed itself.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

__all__ = ["PAUSE_BYTES", "PAUSE_MESSAGES", "REPEAT_OFFENCE_S", "Allowance", "Verdict"]

PAUSE_MESSAGES: Final = 2000
PAUSE_BYTES: Final = 1024 * 1024
REPEAT_OFFENCE_S: Final = 60.0


class Verdict(enum.Enum):
    """What to do with a publish on a flowed channel."""

    FORWARD = "forward"
    CLOSE_CHANNEL = "close channel"  # CHN-1012
    CLOSE_CONNECTION = "close connection"  # again within REPEAT_OFFENCE_S


class Allowance:
    """The back-pressure allowance of one connection."""

    __slots__ = ("_enforcement", "bytes", "last_ignored", "messages")

    def __init__(self, enforcement: float | None) -> None:
        self._enforcement = enforcement  # seconds; None: never close
        self.messages = 0
        self.bytes = 0
        self.last_ignored: float | None = None

    @property
    def spent(self) -> bool:
        """Past the allowance: the connection's reads pause."""
        return self.messages > PAUSE_MESSAGES or self.bytes > PAUSE_BYTES

    def count(self, size: int) -> bool:
        """A publish on a flowed channel; True once the allowance is spent."""
        self.messages += 1
        self.bytes += size
        return self.spent

    def renew(self) -> None:
        """Every channel of the connection is unflowed."""
        self.messages = self.bytes = 0

    def pause_until(self, flowed_since: Iterable[float]) -> float | None:
        """When paused reads may resume (inf: once unflowed); None: nothing flowed.

        Just past the last channel's timeout, so its next publish is judged.
        """
        latest = max(flowed_since, default=None)
        if latest is None:
            return None
        if self._enforcement is None:
            return float("inf")
        return latest + self._enforcement + 0.001

    def judge(self, now: float, flowed_at: float | None) -> Verdict:
        """A publish on a channel flowed since ``flowed_at`` (None: not flowed)."""
        timeout = self._enforcement
        if flowed_at is None or timeout is None or now - flowed_at <= timeout:
            return Verdict.FORWARD
        last, self.last_ignored = self.last_ignored, now
        if last is not None and now - last <= REPEAT_OFFENCE_S:
            return Verdict.CLOSE_CONNECTION
        return Verdict.CLOSE_CHANNEL
