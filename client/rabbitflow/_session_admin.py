"""A sync session's admin channel, and what the session does on it: declare,
check, bind and delete its destinations."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._destination import Topic
from ._exceptions import InvalidDestinationError
from ._session_core import AdminHandler
from ._transport_base import ChannelHandler
from ._transport_channel import TransportChannel

__all__ = ["SessionAdmin"]


class SessionAdmin:
    """A session's declarations, on a channel of their own: opened when first
    needed, again once a failed passive declaration closed it, and on the new
    transport once a recovery forgot it.

    A failed passive declaration closes the channel: the lock keeps the
    session's other threads off it until it is replaced.
    """

    def __init__(self, open_channel: Callable[[ChannelHandler], TransportChannel]) -> None:
        self._open_channel = open_channel  # on the connection's transport in use
        self._lock = threading.RLock()
        self._channel: TransportChannel | None = None

    def _current(self) -> TransportChannel:
        """The admin channel, opened if need be (the caller holds the lock)."""
        channel = self._channel
        if channel is None or channel.closed:
            channel = self._open_channel(AdminHandler())
            self._channel = channel
        return channel

    def ensure_queue(self, name: str) -> None:
        """Declare the queue ``name`` (durable, no arguments) only if missing.

        Raises:
            JMSException: the broker refused, or the connection failed.
        """
        with self._lock:
            try:
                self._current().queue_declare(name, passive=True)
            except InvalidDestinationError:
                self._current().queue_declare(name, durable=True)

    def ensure_exchange(self, name: str) -> None:
        """Declare the durable topic exchange ``name`` only if missing.

        Raises:
            JMSException: the broker refused (e.g. another type), or the
                connection failed.
        """
        with self._lock:
            try:
                self._current().exchange_declare(name, "topic", passive=True)
            except InvalidDestinationError:
                self._current().exchange_declare(name, "topic")

    def check_queue(self, name: str) -> None:
        """Raise unless the queue ``name`` exists.

        Raises:
            InvalidDestinationError: it does not.
            JMSException: the connection failed.
        """
        with self._lock:
            self._current().queue_declare(name, passive=True)

    def subscribe(self, topic: Topic, name: str) -> str:
        """The queue of a subscription to ``topic``, bound to its exchange: the
        durable queue ``name``, or ("") a new private one (exclusive: it goes
        with the connection).

        Raises:
            JMSException: the broker refused, or the connection failed.
        """
        with self._lock:
            self.ensure_exchange(topic.exchange)
            admin = self._current()
            if name:
                queue, _, _ = admin.queue_declare(name, durable=True)
            else:
                queue, _, _ = admin.queue_declare(
                    "", durable=False, exclusive=True, auto_delete=True
                )
            admin.queue_bind(queue, topic.exchange, "#")
            return queue

    def delete_queue(self, name: str) -> None:
        """Delete the queue ``name``.

        Raises:
            JMSException: the broker refused, or the connection failed.
        """
        with self._lock:
            self._current().queue_delete(name)

    def forget(self) -> None:
        """The channel went with its transport: the next use opens another."""
        with self._lock:
            self._channel = None

    def close(self) -> None:
        """Close the channel (the next use would open another)."""
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
