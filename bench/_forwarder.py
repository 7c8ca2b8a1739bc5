"""A byte forwarder on uvloop: what any proxy process costs, with no protocol work.

``python -m bench._forwarder LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT`` accepts
connections on 127.0.0.1:LISTEN_PORT and copies bytes both ways to the
upstream, as the gateway's sockets do (TCP_NODELAY, one ``transport.write``
per read, reading paused while the other side's buffer is full), but parses
nothing.  ``bench/proxy_floor.py`` runs it beside the gateway.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import cast

import uvloop


class _Side(asyncio.Protocol):
    """One socket of a forwarded pair; what it reads goes to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def _serve(port: int, host: str, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()

    def accepted() -> _Side:
        client = _Side()

        async def connect() -> None:
            try:
                _transport, upstream = await loop.create_connection(_Side, host, upstream_port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            upstream.peer, client.peer = client, upstream
            assert upstream.transport is not None
            for chunk in client.pending:
                upstream.transport.write(chunk)
            client.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accepted, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    port, host, upstream_port = int(argv[0]), argv[1], int(argv[2])
    uvloop.run(_serve(port, host, upstream_port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
