"""Carries out the gateway's blocking changes for the asyncio drivers.

The gateway hub never calls into a connection: it accumulates what changed
(:class:`~rabbitflow_broker.hub.gateway.Changes`) and calls
:attr:`Gateway.on_change <rabbitflow_broker.hub.gateway.Gateway.on_change>` when
changes become pending.  The first driver installs a :class:`Refresher`
there; it takes the changes on the next turn of the event loop (never inside
the change, nor inside an engine call) and refreshes the connections of the
vhosts they concern.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["Refreshable", "Refresher"]


@runtime_checkable
class Refreshable(Protocol):
    """A connection the refresher can re-check (a relay)."""

    @property
    def vhost(self) -> str: ...

    def refresh(self) -> None: ...


class Refresher:
    """The gateway's ``on_change``: schedules one pass over the connections."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._scheduled = False

    def __call__(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a change made outside the event loop: no engine runs now
            self._run()
            return
        self._scheduled = True
        loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        changes = self._gateway.take_changes()
        if changes is None:
            return
        for connection in self._gateway.connections:
            if isinstance(connection, Refreshable) and changes.concerns(connection.vhost):
                connection.refresh()
