"""The relay over in-memory streams: no sockets, no RabbitMQ, no sleeping."""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.base import Frame
from pamqp.body import ContentBody

from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.events import ChannelFlowEnforced, ChannelFlowRemoved, Event
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.relay import Relay
from tests.broker.fakes import (
    HEARTBEAT,
    FakeTransport,
    RefreshWatch,
    connected_relay,
    wait_until,
)
from tests.broker.frame_reader import FrameReader, decode_method


@dataclass
class Harness:
    gateway: Gateway
    events: list[Event]
    client_in: FakeTransport
    client_out: FakeTransport
    upstream_in: FakeTransport
    upstream_out: FakeTransport
    refreshes: RefreshWatch

    def settled(self) -> bool:
        """The relay read every byte fed to either side, and no refresh it
        was asked for is still due."""
        return not (self.client_in.pending or self.upstream_in.pending or self.refreshes.pending)

    async def settle(
        self, until: Callable[[], object] | None = None, what: str = "the relay to settle"
    ) -> None:
        """Wait until :meth:`settled` (and ``until``, when given)."""
        await wait_until(lambda: self.settled() and (until is None or until()), what)

    async def from_client(
        self,
        *chunks: bytes,
        until: Callable[[], object] | None = None,
        what: str = "the relay to read the client's bytes",
    ) -> None:
        for chunk in chunks:
            self.client_in.feed_data(chunk)
        await self.settle(until, what)

    async def from_upstream(
        self,
        *chunks: bytes,
        until: Callable[[], object] | None = None,
        what: str = "the relay to read RabbitMQ's bytes",
    ) -> None:
        for chunk in chunks:
            self.upstream_in.feed_data(chunk)
        await self.settle(until, what)

    async def handled_from_client(self, *chunks: bytes) -> None:
        """Feed ``chunks`` then a heartbeat, and wait until the heartbeat
        reached RabbitMQ: the relay is done with what came before it."""
        before = self.upstream_out.heartbeats()
        await self.from_client(
            *chunks,
            HEARTBEAT,
            until=lambda: self.upstream_out.heartbeats() > before,
            what="the heartbeat sent after them to reach RabbitMQ",
        )

    async def handled_from_upstream(self, *chunks: bytes) -> None:
        """Feed ``chunks`` then a heartbeat, and wait until the heartbeat
        reached the client: the relay is done with what came before it."""
        before = self.client_out.heartbeats()
        await self.from_upstream(
            *chunks,
            HEARTBEAT,
            until=lambda: self.client_out.heartbeats() > before,
            what="the heartbeat sent after them to reach the client",
        )


def _sent(transport: FakeTransport, kind: type[Frame]) -> bool:
    """Whether a ``kind`` method was written to ``transport`` (since its last take)."""
    return any(isinstance(m, kind) for _, m in transport.methods())


def method(channel: int, value: Frame) -> bytes:
    return pamqp_frame.marshal(value, channel)


def message(channel: int, head: Frame, body: bytes, *, split_body: bool = False) -> list[bytes]:
    header = pamqp_frame.marshal(
        pamqp_header.ContentHeader(0, len(body), commands.Basic.Properties()), channel
    )
    if split_body:
        half = len(body) // 2
        return [
            method(channel, head) + header + pamqp_frame.marshal(ContentBody(body[:half]), channel),
            pamqp_frame.marshal(ContentBody(body[half:]), channel),
        ]
    return [method(channel, head) + header + pamqp_frame.marshal(ContentBody(body), channel)]


def publish(channel: int, queue: str, body: bytes = b"x") -> bytes:
    return message(channel, commands.Basic.Publish(exchange="", routing_key=queue), body)[0]


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    events: list[Event] = []
    gateway = Gateway(
        GatewayConfig(), sink=events.append, clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    )
    gateway.routing.declare_queue("/", "q", {})
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 1, "qpid.flow_resume_count": 1})
    relay, client_in, upstream_in = connected_relay(gateway)
    client_out, upstream_out = client_in, upstream_in
    h = Harness(
        gateway, events, client_in, client_out, upstream_in, upstream_out, RefreshWatch(gateway)
    )
    await h.from_client(
        PROTOCOL_HEADER,
        method(1, commands.Channel.Open()),
        until=lambda: _sent(upstream_out, commands.Channel.Open),
        what="the Channel.Open to reach RabbitMQ",
    )
    upstream_out.take()
    yield h
    client_in.feed_eof()
    upstream_in.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


@pytest.mark.asyncio
async def test_client_flow_ok_never_reaches_upstream(harness: Harness) -> None:
    await harness.handled_from_client(method(1, commands.Channel.FlowOk(active=False)))
    assert harness.upstream_out.take() == []


@pytest.mark.asyncio
async def test_publishes_are_forwarded_byte_for_byte(harness: Harness) -> None:
    raw = publish(1, "q") + publish(1, "other")
    await harness.from_client(
        raw, until=lambda: len(harness.upstream_out.data) >= len(raw), what="the publishes relayed"
    )
    assert bytes(harness.upstream_out.data) == raw


@pytest.mark.asyncio
async def test_publish_over_stop_flows_the_channel_once(harness: Harness) -> None:
    await harness.handled_from_client(publish(1, "q"), publish(1, "q"), publish(1, "q"))
    flows = [m for _, m in harness.client_out.take() if isinstance(m, commands.Channel.Flow)]
    assert [f.active for f in flows] == [False]
    assert [type(e) for e in harness.events if e.code.startswith("CHN")] == [ChannelFlowEnforced]


@pytest.mark.asyncio
async def test_held_confirm_is_released_as_one_multiple_ack(harness: Harness) -> None:
    await harness.from_client(method(1, commands.Confirm.Select()))
    await harness.from_client(publish(1, "q"), publish(1, "q"))
    await harness.handled_from_upstream(
        method(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    )
    assert not [m for _, m in harness.client_out.take() if isinstance(m, commands.Basic.Ack)]
    harness.gateway.removed("/", "q", 2, 2)
    await harness.settle(
        lambda: (
            _sent(harness.client_out, commands.Basic.Ack)
            and _sent(harness.client_out, commands.Channel.Flow)
        ),
        "the released confirm and the Channel.Flow that unflows the channel",
    )
    sent = [m for _, m in harness.client_out.take()]
    acks = [(m.delivery_tag, m.multiple) for m in sent if isinstance(m, commands.Basic.Ack)]
    assert acks == [(2, True)]
    assert [m.active for m in sent if isinstance(m, commands.Channel.Flow)] == [True]
    assert isinstance(harness.events[-1], ChannelFlowRemoved)


@pytest.mark.asyncio
async def test_multiple_ack_is_split_when_only_part_is_held(harness: Harness) -> None:
    harness.gateway.routing.declare_queue("/", "free", {})
    await harness.from_client(method(1, commands.Confirm.Select()))
    await harness.from_client(publish(1, "free"), publish(1, "q"), publish(1, "q"))
    await harness.handled_from_upstream(
        method(1, commands.Basic.Ack(delivery_tag=3, multiple=True))
    )
    acks = [
        (m.delivery_tag, m.multiple)
        for _, m in harness.client_out.take()
        if isinstance(m, commands.Basic.Ack)
    ]
    assert acks == [(1, False)]


@pytest.mark.asyncio
async def test_refused_declare_closes_channel_406_and_stays_local(harness: Harness) -> None:
    declare = commands.Queue.Declare(queue="bad", arguments={"qpid.flow_stop_count": -1})
    await harness.handled_from_client(method(1, declare))
    upstream = harness.upstream_out.take()
    assert not any(isinstance(m, commands.Queue.Declare) for _, m in upstream)
    assert any(isinstance(m, commands.Channel.Close) for _, m in upstream)
    ((channel, close),) = harness.client_out.take()
    assert channel == 1
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406
    assert "qpid.flow_stop_count" in close.reply_text
    # The client's CloseOk and RabbitMQ's CloseOk are both the gateway's business.
    await harness.handled_from_client(method(1, commands.Channel.CloseOk()))
    await harness.handled_from_upstream(method(1, commands.Channel.CloseOk()))
    assert harness.upstream_out.take() == []
    assert harness.client_out.take() == []


@pytest.mark.asyncio
async def test_reopened_channel_waits_for_upstream_close_ok(harness: Harness) -> None:
    declare = commands.Queue.Declare(queue="bad", arguments={"qpid.flow_stop_count": "x"})
    await harness.handled_from_client(method(1, declare), method(1, commands.Channel.CloseOk()))
    harness.upstream_out.take()
    await harness.handled_from_client(method(1, commands.Channel.Open()))
    assert harness.upstream_out.take() == []
    await harness.from_upstream(
        method(1, commands.Channel.CloseOk()),
        until=lambda: _sent(harness.upstream_out, commands.Channel.Open),
        what="the held Channel.Open to reach RabbitMQ",
    )
    assert [type(m) for _, m in harness.upstream_out.take()] == [commands.Channel.Open]


@pytest.mark.asyncio
async def test_gateway_frame_waits_for_the_end_of_a_delivery(harness: Harness) -> None:
    await harness.from_client(publish(1, "q"), publish(1, "q"))  # flowed
    harness.client_out.take()
    first, rest = message(
        1, commands.Basic.Deliver("ctag", 1, False, "", "q"), b"0123456789", split_body=True
    )
    await harness.from_upstream(first)
    harness.gateway.removed("/", "q", 2, 2)  # unflow while the delivery is half written
    await harness.settle(  # the relay decided to unflow: the Flow frame waits
        lambda: any(isinstance(e, ChannelFlowRemoved) for e in harness.events),
        "the refresh that unflows the channel",
    )
    assert not any(isinstance(m, commands.Channel.Flow) for _, m in harness.client_out.methods())
    await harness.from_upstream(
        rest,
        until=lambda: _sent(harness.client_out, commands.Channel.Flow),
        what="the Channel.Flow after the delivery",
    )
    buffer, frames = FrameReader().feed(bytes(harness.client_out.data))
    assert [f.kind for f in frames] == [1, 2, 3, 3, 1]  # deliver, header, 2 bodies, flow
    assert isinstance(decode_method(frames[-1].payload(buffer)), commands.Channel.Flow)


@pytest.mark.asyncio
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
async def test_deliveries_are_counted_alike_whole_or_split(harness: Harness, split: bool) -> None:
    await harness.from_client(method(1, commands.Basic.Consume(queue="q", consumer_tag="ctag")))
    await harness.from_upstream(method(1, commands.Basic.ConsumeOk("ctag")))
    await harness.from_client(publish(1, "q", b"0123456789"))
    chunks = message(
        1, commands.Basic.Deliver("ctag", 1, False, "", "q"), b"0123456789", split_body=split
    )
    await harness.from_upstream(
        *chunks,
        until=lambda: bytes(harness.client_out.data).endswith(b"".join(chunks)),
        what="the delivery relayed to the client",
    )
    depth = harness.gateway.depth.get(("/", "q"))
    assert (depth.messages, depth.bytes) == (1, 10)
    await harness.from_client(method(1, commands.Basic.Ack(delivery_tag=1)))
    depth = harness.gateway.depth.get(("/", "q"))
    assert (depth.messages, depth.bytes) == (0, 0)


def _flows(data: bytes, channel: int) -> list[bool]:
    """The ``active`` flags of the Channel.Flow frames sent on ``channel``, in order."""
    buffer, frames = FrameReader().feed(data)
    methods = [
        decode_method(f.payload(buffer)) for f in frames if f.kind == 1 and f.channel == channel
    ]
    return [m.active for m in methods if isinstance(m, commands.Channel.Flow)]


@pytest.mark.asyncio
@pytest.mark.parametrize("unflowing_channel", [1, 2], ids=["same-channel", "other-channel"])
async def test_a_channels_flow_frames_never_overtake_each_other(unflowing_channel: int) -> None:
    # Channel 1 publishes to q; both channels consume q without acks.  Flow(false)
    # for channel 1 waits behind a half-written delivery on channel 1; later
    # deliveries in the same read (on either channel) unflow the queue, and
    # Flow(true) must come after Flow(false).
    gateway = Gateway(GatewayConfig(), sink=lambda event: None)
    gateway.routing.declare_queue("/", "q", {})
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 2, "qpid.flow_resume_count": 2})
    relay, client, upstream = connected_relay(gateway)
    h = Harness(gateway, [], client, client, upstream, upstream, RefreshWatch(gateway))
    await h.from_client(
        PROTOCOL_HEADER, method(1, commands.Channel.Open()), method(2, commands.Channel.Open())
    )
    for number in (1, 2):
        consume = commands.Basic.Consume(queue="q", consumer_tag=f"c{number}", no_ack=True)
        await h.from_client(method(number, consume))
        await h.from_upstream(method(number, commands.Basic.ConsumeOk(f"c{number}")))
    await h.from_client(publish(1, "q"), publish(1, "q"))
    first, rest = message(
        1, commands.Basic.Deliver("c1", 1, False, "", "q"), b"0123456789", split_body=True
    )
    await h.from_upstream(first)
    await h.from_client(publish(1, "q"), publish(1, "q"))  # overfull: channel 1 flowed
    tag = f"c{unflowing_channel}"
    deliveries = [
        message(unflowing_channel, commands.Basic.Deliver(tag, n, False, "", "q"), b"a")[0]
        for n in (2, 3)
    ]
    await h.from_upstream(  # depth back to 2: unflowed
        rest + b"".join(deliveries),
        until=lambda: len(_flows(bytes(client.data), 1)) >= 2,
        what="a second Channel.Flow on channel 1",
    )
    assert not relay.engine.channels[1].blockers
    assert _flows(bytes(client.data), 1) == [False, True]
    client.feed_eof()
    upstream.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


@pytest.mark.asyncio
async def test_bad_frame_closes_connection_with_frame_error(harness: Harness) -> None:
    await harness.from_client(
        b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0b\x00",
        until=lambda: harness.client_out.closed,
        what="the client connection closed",
    )
    ((channel, close),) = harness.client_out.take()
    assert channel == 0
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501
    assert harness.client_out.closed


class _EagerTransport(FakeTransport):
    """Delivers data even while paused before the first resume, as uvloop
    does for bytes that arrive while ``connection_made`` runs."""

    def pause_reading(self) -> None:
        if self.protocol is not None and getattr(self, "started", False):
            super().pause_reading()

    def resume_reading(self) -> None:
        self.started = True
        super().resume_reading()


@pytest.mark.asyncio
async def test_client_bytes_before_upstream_is_open_are_relayed_in_order() -> None:
    gateway = Gateway(GatewayConfig(), sink=lambda event: None)
    opened = asyncio.Event()
    upstream = FakeTransport()

    async def connect(host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> Any:
        await opened.wait()
        upstream.attach(factory())
        return upstream

    client = _EagerTransport()
    relay = Relay(gateway, connector=connect)
    client.attach(relay)
    first, second = PROTOCOL_HEADER, method(1, commands.Channel.Open())
    client.feed_data(first)
    client.feed_data(second)
    opened.set()
    want = first + second
    await wait_until(lambda: len(upstream.data) >= len(want), "the client's bytes relayed")
    assert bytes(upstream.data) == want
    client.feed_eof()
    upstream.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


@pytest.mark.asyncio
async def test_a_slow_upstream_stops_client_reads_within_a_small_backlog_losing_nothing() -> None:
    """When RabbitMQ reads slower than a client publishes, the backlog waits in
    the client's socket: the relay stops reading the client once little is
    queued toward RabbitMQ (its transport's 64 KiB and the kernel's unsent
    bytes capped by ``TCP_NOTSENT_LOWAT``), then relays everything in order."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader's small window
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    upstream_sockets: list[socket.socket] = []

    async def connect(host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> Any:
        accepting = loop.create_task(loop.sock_accept(listener))
        transport, _ = await loop.create_connection(factory, *listener.getsockname())
        upstream_sockets.append((await accepting)[0])
        return transport

    gateway = Gateway(GatewayConfig(), sink=lambda event: None)
    client = FakeTransport()
    relay = Relay(gateway, connector=connect)
    client.attach(relay)
    sent = bytearray(PROTOCOL_HEADER + method(1, commands.Channel.Open()))
    client.feed_data(bytes(sent))
    batch = b"".join(publish(1, "q", bytes([n % 256]) * 256) for n in range(100))  # ~34 KiB
    deadline = loop.time() + 10
    while not client.paused or not upstream_sockets:
        assert len(sent) < 1024 * 1024, "the client was still read after 1 MiB queued upstream"
        assert loop.time() < deadline, "the client was never paused"
        client.feed_data(batch)
        sent += batch
        await asyncio.sleep(0.01)  # the transport's write attempts and its pause_writing
    read = len(sent) - sum(len(item or b"") for item in client._inbox)
    assert read < 400 * 1024  # what the relay took from the client before it stopped
    upstream = relay._upstream
    assert upstream is not None
    sock = upstream.get_extra_info("socket")
    unsent_option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if unsent_option is not None:
        assert sock.getsockopt(socket.IPPROTO_TCP, unsent_option) == 32 * 1024

    received = bytearray()
    peer = upstream_sockets[0]
    peer.setblocking(False)
    while len(received) < len(sent):  # RabbitMQ catches up: everything arrives, in order
        assert loop.time() < deadline + 20, f"{len(received)} of {len(sent)} bytes relayed"
        chunk = await asyncio.wait_for(loop.sock_recv(peer, 1 << 20), 10)
        assert chunk, "the upstream connection closed early"
        received += chunk
    assert bytes(received) == bytes(sent)
    assert not client.paused
    client.feed_eof()
    peer.close()
    listener.close()
    await asyncio.wait_for(relay.wait_closed(), 5)
