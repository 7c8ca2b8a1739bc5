"""A closed connection is freed by reference counting alone.

With the cycle collector disabled, the relay, its pump and its engine (with
its channels) must be gone as soon as both sockets are closed and nothing
outside holds them: the gateway's collector runs rarely, and what waits
for it under connection churn is memory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import socket
import struct
import weakref
from collections.abc import Iterator

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.base import Frame
from pamqp.body import ContentBody

from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.relay import Relay
from tests.broker.fakes import connected_relay, wait_until


def _method(channel: int, value: Frame) -> bytes:
    return pamqp_frame.marshal(value, channel)


def _publish(channel: int) -> bytes:
    return (
        _method(channel, commands.Basic.Publish(exchange="", routing_key="q"))
        + pamqp_frame.marshal(
            pamqp_header.ContentHeader(0, 1, commands.Basic.Properties()), channel
        )
        + pamqp_frame.marshal(ContentBody(b"x"), channel)
    )


#: A client that opened two channels, selected confirms and left a publish
#: unconfirmed: the state a connection dropped mid-work leaves behind.
_BUSY_CLIENT = (
    PROTOCOL_HEADER
    + _method(1, commands.Channel.Open())
    + _method(2, commands.Channel.Open())
    + _method(1, commands.Confirm.Select())
    + _publish(1)
)


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _gateway() -> Gateway:
    gateway = Gateway(
        GatewayConfig(), sink=lambda _event: None, clock=lambda: dt.datetime.now(dt.UTC)
    )
    gateway.routing.declare_queue("/", "q", {})
    gateway.queue_declared("/", "q", {})
    return gateway


class _Probe:
    """Whether one object is still alive, without keeping it alive: a weak
    reference, or, for classes compiled with mypyc (which take none), its
    identity among the objects the collector tracks (read, never collected)."""

    def __init__(self, obj: object) -> None:
        self._ref: weakref.ref[object] | None
        try:
            self._ref = weakref.ref(obj)
        except TypeError:
            self._ref = None
        self._type, self._id = type(obj), id(obj)

    def alive(self) -> bool:
        if self._ref is not None:
            return self._ref() is not None
        return any(type(o) is self._type and id(o) == self._id for o in gc.get_objects())


class Watched:
    """Probes on a relay's parts."""

    def __init__(self, relay: Relay) -> None:
        channels = list(relay.engine.channels.values())
        assert len(channels) == 2, "the client's two channels are open"
        self.probes = {
            "relay": _Probe(relay),
            "engine": _Probe(relay.engine),
            "pump": _Probe(relay._pump),
            **{f"channel {c.number}": _Probe(c) for c in channels},
        }

    def alive(self) -> list[str]:
        return [name for name, probe in self.probes.items() if probe.alive()]


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("ending", ["client eof", "client lost", "upstream eof"])
async def test_closed_relay_is_freed_without_the_collector(ending: str) -> None:
    relay, client, upstream = connected_relay(_gateway())
    await wait_until(
        lambda: upstream.protocol is not None and not client.paused, "the upstream connection"
    )
    client.feed_data(_BUSY_CLIENT)
    await wait_until(lambda: not client.pending, "the relay to read the client's bytes")
    assert relay.engine.in_flight == 1
    watched = Watched(relay)
    if ending == "client eof":
        client.feed_eof()
    elif ending == "client lost":
        client.abort()  # a reset: no EOF, the socket is just gone
    else:
        upstream.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)
    assert client.lost
    assert upstream.lost
    del relay
    assert watched.alive() == []


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_collector")
async def test_relay_on_real_sockets_is_freed_without_the_collector() -> None:
    """The same with the event loop's own transports: a loopback stand-in
    for RabbitMQ that reads and never answers."""
    loop = asyncio.get_running_loop()
    upstream_ends: list[asyncio.StreamWriter] = []

    async def silent_upstream(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_ends.append(writer)

    rabbit = await asyncio.start_server(silent_upstream, "127.0.0.1", 0)
    rabbit_port = rabbit.sockets[0].getsockname()[1]
    gateway = Gateway(
        GatewayConfig(upstream=f"amqp://guest:guest@127.0.0.1:{rabbit_port}/"),
        sink=lambda _event: None,
    )
    gateway.routing.declare_queue("/", "q", {})
    relays: list[Relay] = []

    def new_relay() -> Relay:
        relay = Relay(gateway)
        relays.append(relay)
        return relay

    server = await loop.create_server(new_relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_BUSY_CLIENT)
        await writer.drain()
        await wait_until(
            lambda: relays and len(relays[0].engine.channels) == 2,
            "the client's two channels open",
            interval=0.01,
        )
        (relay,) = relays
        watched = Watched(relay)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset
        await asyncio.wait_for(relay.wait_closed(), 5)
        relays.clear()
        del relay
        # The transports let go of the relay in their own close callbacks.
        await wait_until(
            lambda: not watched.alive(),
            "the relay's parts to be freed by reference counting",
            interval=0.01,
            state=watched.alive,
        )
        assert watched.alive() == []
    finally:
        for end in upstream_ends:
            end.close()
        server.close()
        rabbit.close()
        await server.wait_closed()
        await rabbit.wait_closed()
