"""The gateway's own AMQP connections to RabbitMQ: opening one, reading its methods (asyncio).

The depth poll (:mod:`~rabbitflow_broker.server.depth_poller`) and the cluster's
control bus (:mod:`~rabbitflow_broker.server.cluster_bus`) log in the same way:
protocol header, Start and Start-Ok (PLAIN), Tune and Tune-Ok, Open and
Open-Ok.  :func:`open_connection` does that and says which frame_max was
agreed (a publish's body goes in frames no larger); channels and what
follows are the caller's.  Failures raise the caller's own error class.
"""

from __future__ import annotations

import asyncio
import ssl
import struct

from pamqp import commands, frame, header
from pamqp.base import Frame

from rabbitflow_broker.engine.errors import OutsideError

__all__ = ["FRAME_MAX", "open_connection", "read_method"]

_FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
#: The largest frame the gateway's own connections ask for.
FRAME_MAX = 131072


async def read_method(
    reader: asyncio.StreamReader, channel: int, error: type[OutsideError], what: str
) -> Frame:
    """The next method frame on ``channel``, skipping heartbeats and other
    channels' frames.

    Raises:
        error: a malformed frame, or RabbitMQ closed the connection (the text
            says ``what`` was closed, with RabbitMQ's reply code and text).
        asyncio.IncompleteReadError: the connection ended.
    """
    while True:
        head = await reader.readexactly(7)
        _kind, _number, size = _FRAME_HEAD.unpack(head)
        rest = await reader.readexactly(size + 1)
        if rest[-1] != _FRAME_END:
            raise error("malformed frame from RabbitMQ")
        _, number, value = frame.unmarshal(head + rest)
        if isinstance(value, commands.Connection.Close):
            raise error(f"RabbitMQ closed {what}: {value.reply_code} {value.reply_text}")
        if number == channel and isinstance(value, Frame):
            return value


async def open_connection(
    host: str,
    port: int,
    *,
    user: str,
    password: str,
    vhost: str,
    name: str,
    error: type[OutsideError],
    what: str,
    heartbeat: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """An open AMQP connection to ``vhost``, shown in RabbitMQ as ``name``,
    with AMQP heartbeats every ``heartbeat`` seconds (0: none), and the
    frame_max agreed in Tune-Ok (the largest frame either side may send,
    at most :data:`FRAME_MAX`).  ``what`` names the connection in errors
    ("the depth poll's connection").

    Raises:
        error: RabbitMQ refused the login or the vhost, or sent something else.
        OSError: RabbitMQ is unreachable (the caller bounds the whole with a timeout).
    """
    reader, writer = await asyncio.open_connection(
        host,
        port,
        ssl=ssl_context,
        server_hostname=server_hostname if ssl_context is not None else None,
    )
    try:
        writer.write(header.ProtocolHeader().marshal())
        start = await read_method(reader, 0, error, what)
        if not isinstance(start, commands.Connection.Start):
            raise error(f"RabbitMQ did not start {what}: {start!r}")
        login = commands.Connection.StartOk(
            client_properties={"product": "rabbitflow-gateway", "connection_name": name},
            mechanism="PLAIN",
            response=f"\0{user}\0{password}",
        )
        writer.write(frame.marshal(login, 0))
        tune = await read_method(reader, 0, error, what)
        if not isinstance(tune, commands.Connection.Tune):
            raise error(f"RabbitMQ refused the login of {what}: {tune!r}")
        frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        tune_ok = commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=frame_max, heartbeat=heartbeat
        )
        writer.write(frame.marshal(tune_ok, 0))
        writer.write(frame.marshal(commands.Connection.Open(virtual_host=vhost), 0))
        opened = await read_method(reader, 0, error, what)
        if not isinstance(opened, commands.Connection.OpenOk):
            raise error(f"RabbitMQ refused vhost {vhost!r} to {what}: {opened!r}")
    except BaseException:
        writer.close()  # a failed or cancelled login leaves no socket behind
        raise
    return reader, writer, frame_max
