"""The admin views of one relayed connection, read off its engine.

Kept apart from the engine's modules: those may be compiled (see
:mod:`~rabbitflow_broker.accel`), and the driver's class, which mixes these
views in, stays interpreted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rabbitflow_broker.hub.gateway import BlockedChannel

if TYPE_CHECKING:
    from rabbitflow_broker.engine.connection import Engine

__all__ = ["EngineViews"]


class EngineViews:
    """The admin views of a connection, for a driver that holds an :class:`Engine`."""

    engine: Engine

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        """Channels of this connection currently flowed."""
        e = self.engine
        for channel in e.channels.values():
            if channel.blockers:
                yield BlockedChannel(
                    connection=e.number,
                    channel=channel.number,
                    user=e.user,
                    remote=f"{e.remote_host}:{e.remote_port}",
                    vhost=e.vhost,
                    blocked_on=tuple(channel.blockers),
                )

    def held_confirms(self) -> int:
        """Confirms and commit-oks currently held from the client."""
        return self.engine.held_confirms()

    def count_unacked(self, into: dict[tuple[str, str], int]) -> None:
        """Add this connection's unacknowledged deliveries per (vhost, queue)."""
        e = self.engine
        per_queue: dict[str, int] = {}
        for channel in e.channels.values():
            channel.deliveries.count_by_queue(per_queue)
        vhost = e.vhost
        for queue, count in per_queue.items():
            key = (vhost, queue)
            into[key] = into.get(key, 0) + count

    def channel_count(self) -> int:
        """Open channels."""
        return len(self.engine.channels)

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        """Admin API view of this connection's channels."""
        e = self.engine
        for channel in e.channels.values():
            yield {
                "connection": e.number,
                "channel": channel.number,
                "user": e.user,
                "remote": f"{e.remote_host}:{e.remote_port}",
                "vhost": e.vhost,
                **channel.describe(),
            }
