"""Destinations: a Queue (default exchange, routing key = queue name) or a
Topic (a topic exchange; producers publish with the topic's routing key)."""

from __future__ import annotations

from dataclasses import dataclass

from ._exceptions import InvalidDestinationError

__all__ = ["Destination", "Queue", "TemporaryQueue", "Topic"]


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not name or len(name.encode()) > 255:
        raise InvalidDestinationError(
            f"{kind} name must be a non-empty string of at most 255 bytes, got {name!r}"
        )


@dataclass(frozen=True, slots=True)
class Queue:
    """A named queue."""

    name: str

    def __post_init__(self) -> None:
        _check_name("queue", self.name)

    @property
    def exchange(self) -> str:
        """Exchange a producer publishes to (the default exchange)."""
        return ""

    @property
    def routing_key(self) -> str:
        """Routing key a producer publishes with."""
        return self.name

    def __str__(self) -> str:
        return f"queue://{self.name}"


@dataclass(frozen=True, slots=True)
class TemporaryQueue(Queue):
    """A server-named, exclusive queue that lives as long as its connection."""

    def __str__(self) -> str:
        return f"temp-queue://{self.name}"


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic: the durable topic exchange ``name``; producers publish to it
    with routing key ``name``, subscribers bind their queue with ``#``."""

    name: str

    def __post_init__(self) -> None:
        _check_name("topic", self.name)

    @property
    def exchange(self) -> str:
        """Exchange a producer publishes to."""
        return self.name

    @property
    def routing_key(self) -> str:
        """Routing key a producer publishes with."""
        return self.name

    def __str__(self) -> str:
        return f"topic://{self.name}"


Destination = Queue | Topic
