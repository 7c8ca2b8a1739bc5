"""When to say that RabbitMQ went away, is still away, or came back (pure)."""

from __future__ import annotations

from typing import Literal

__all__ = ["OUTAGE_REMINDER_S", "OutageLog"]

#: Seconds between "upstream still lost" reminders during an outage.
OUTAGE_REMINDER_S = 30.0


class OutageLog:
    """When to say that RabbitMQ went away, is still away, or came back (pure).

    ``failed(now)`` returns ``"lost"`` for the first failure of an outage,
    ``"still lost"`` when the last line is at least ``reminder`` seconds
    old, else None; ``succeeded(now)`` returns the outage's length in
    seconds when it just ended, else None.
    """

    def __init__(self, *, reminder: float = OUTAGE_REMINDER_S) -> None:
        self.reminder = reminder
        self.down_since: float | None = None
        self._said_at = 0.0

    def failed(self, now: float) -> Literal["lost", "still lost"] | None:
        """One failed exchange with RabbitMQ at ``now``."""
        if self.down_since is None:
            self.down_since = self._said_at = now
            return "lost"
        if now - self._said_at >= self.reminder:
            self._said_at = now
            return "still lost"
        return None

    def succeeded(self, now: float) -> float | None:
        """One good exchange with RabbitMQ at ``now``."""
        if self.down_since is None:
            return None
        outage, self.down_since = now - self.down_since, None
        return outage
