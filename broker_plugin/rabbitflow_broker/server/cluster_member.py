"""Who a cluster member is: its id, and how it describes itself in its
heartbeats (``hello``) and in ``GET /api/cluster``."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rabbitflow_broker.hub.config import GatewayConfig
    from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["member_description", "member_id"]


def member_id() -> str:
    """A member id unique across restarts: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def member_description(
    gateway: Gateway, config: GatewayConfig, ports: Callable[[], dict[str, int]]
) -> Callable[[], dict[str, Any]]:
    """This member as its heartbeats describe it: host, pid, the addresses it
    listens on (``ports``: known once it listens), connections, start time."""
    started = dt.datetime.now(dt.UTC).isoformat()
    host = socket.gethostname()

    def description() -> dict[str, Any]:
        listening = ports()
        listen = config.listen_address
        return {
            "host": host,
            "pid": os.getpid(),
            "listen": None if listen is None else f"{listen[0]}:{listening['listen_port']}",
            "admin": f"{config.admin_address[0]}:{listening['admin_port']}",
            "connections": len(gateway.connections),
            "since": started,
        }

    return description
