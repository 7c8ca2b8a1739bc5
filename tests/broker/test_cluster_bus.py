"""The cluster bus on the wire: message bodies larger than a frame.

RabbitMQ's side is a peer on a loopback socket: it answers the bus's
login and declarations (its Tune offers AMQP's smallest frame_max, 4096)
and reads back, or sends, whole frames.  RabbitMQ ends a connection that
sends a frame over the frame_max agreed (501 FRAME_ERROR), and splits a
delivery's body over as many frames as it needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from pamqp import commands, frame, heartbeat
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from rabbitflow_broker.engine.amqp import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from rabbitflow_broker.server.cluster_bus import ControlBus
from tests.broker.frame_reader import FrameReader, decode_method

FRAME_MAX = 4096
#: A state message the size of a few hundred queues' (thousands in production).
STATE = {"t": "state", "m": "m1", "e": 1, "q": [f"tenant-{i:05d}.orders" for i in range(600)]}
#: The queue that records the epochs taken, and how many it holds in the tests.
EPOCHS = "rabbitflow.cluster.t.epochs"
RECORDED = 3


def _answers() -> bytes:
    """Everything the bus waits for from connecting to consuming, in order."""
    answers: list[tuple[int, Frame]] = [
        (0, commands.Connection.Start()),
        (0, commands.Connection.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)),
        (0, commands.Connection.OpenOk()),
        (1, commands.Channel.OpenOk()),
        (1, commands.Exchange.DeclareOk()),
        (1, commands.Queue.DeclareOk("rabbitflow.cluster.t.owner", 0, 0)),
        (1, commands.Queue.DeclareOk("rabbitflow.cluster.t.member.m1", 0, 0)),
        (1, commands.Queue.BindOk()),
        (1, commands.Queue.BindOk()),
        (1, commands.Queue.DeclareOk(EPOCHS, RECORDED, 0)),
        (1, commands.Basic.ConsumeOk("member")),
        (1, commands.Basic.ConsumeOk("owner")),
    ]
    return b"".join(frame.marshal(value, channel) for channel, value in answers)


def _payload(whole: bytes) -> bytes:
    return whole[7:-1]


def _body_size(header_frame: bytes) -> int:
    header = ContentHeader()
    header.unmarshal(_payload(header_frame))
    return header.body_size


def _complete(content: list[bytes]) -> bool:
    """Whether ``content`` (a header frame, then body frames) holds the whole body."""
    return bool(content) and sum(len(_payload(f)) for f in content[1:]) >= _body_size(content[0])


@dataclass
class Peer:
    """RabbitMQ's end of the bus connection, and what the bus handed its member."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Messages the bus passed to ``on_message``: (message, to_owner).
    received: asyncio.Queue[tuple[dict[str, Any], bool]]
    frames: FrameReader = field(default_factory=lambda: FrameReader(expect_protocol_header=True))
    #: Methods read by :meth:`next_method` and not taken yet.
    methods: list[Frame] = field(default_factory=list)

    async def next_publish(self) -> tuple[commands.Basic.Publish, list[bytes]]:
        """The next Basic.Publish and its content frames, whole (the header first)."""
        publish: commands.Basic.Publish | None = None
        content: list[bytes] = []
        while publish is None or not _complete(content):
            buffer, refs = self.frames.feed(await asyncio.wait_for(self.reader.read(65536), 5))
            for ref in refs:
                if ref.kind == FRAME_METHOD and publish is None:
                    method = decode_method(ref.payload(buffer))
                    publish = method if isinstance(method, commands.Basic.Publish) else None
                elif publish is not None and ref.kind in (FRAME_HEADER, FRAME_BODY):
                    content.append(buffer[ref.start : ref.end])
        return publish, content

    async def next_method(self, kind: type[Frame]) -> Frame:
        """The next method of ``kind`` the bus sent (those before it are passed over)."""
        while True:
            while self.methods:
                method = self.methods.pop(0)
                if isinstance(method, kind):
                    return method
            buffer, refs = self.frames.feed(await asyncio.wait_for(self.reader.read(65536), 5))
            self.methods += [
                decode_method(ref.payload(buffer)) for ref in refs if ref.kind == FRAME_METHOD
            ]


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[tuple[Peer, ControlBus]]:
    """A bus connected to a :class:`Peer`, member ``m1`` of cluster ``t``."""
    accepted: asyncio.Queue[Peer] = asyncio.Queue()
    received: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answers())
        await accepted.put(Peer(reader, writer, received))

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    bus = ControlBus(
        cluster="t",
        member="m1",
        nodes=[("127.0.0.1", port)],
        user="guest",
        password="guest",
        lease=2.0,
        on_message=lambda message, to_owner: received.put_nowait((message, to_owner)),
        on_lost=lambda: None,
    )
    await bus.connect()
    end = await asyncio.wait_for(accepted.get(), 5)
    try:
        yield end, bus
    finally:
        await bus.close()
        end.writer.close()
        await end.writer.wait_closed()
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_a_body_over_the_agreed_frame_max_is_sent_in_frames_within_it(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, bus = peer
    data = json.dumps(STATE, separators=(",", ":")).encode()
    assert len(data) > 2 * FRAME_MAX

    assert bus.send(STATE, to="all")
    publish, content = await end.next_publish()

    assert publish.routing_key == "all"
    assert max(map(len, content)) <= FRAME_MAX
    assert len(content) == 1 + -(-len(data) // (FRAME_MAX - 8))  # the header, full body frames
    assert _body_size(content[0]) == len(data)
    assert json.loads(b"".join(map(_payload, content[1:]))) == STATE


@pytest.mark.asyncio
async def test_a_delivery_in_several_body_frames_is_one_message(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, _ = peer
    assert (await asyncio.wait_for(end.received.get(), 5))[0]["t"] == "epoch"  # on connecting
    data = json.dumps(STATE).encode()
    step = FRAME_MAX - 8
    wire = frame.marshal(commands.Basic.Deliver("member", 1, False, "", "all"), 1)
    wire += frame.marshal(ContentHeader(body_size=len(data)), 1)
    for start in range(0, len(data), step):
        wire += frame.marshal(ContentBody(data[start : start + step]), 1)
    for start in range(0, len(wire), 1000):  # frames cut across reads too
        end.writer.write(wire[start : start + 1000])
        await end.writer.drain()

    assert await asyncio.wait_for(end.received.get(), 5) == (STATE, False)
    assert end.received.empty()


@pytest.mark.asyncio
async def test_a_bus_that_hears_nothing_for_four_heartbeats_is_lost() -> None:
    """RabbitMQ's side answers the login, sends heartbeats for a while, then
    goes silent (a cut cable sends no FIN): the bus closes the connection and
    reports it lost after four heartbeat intervals (1 s each at a 2 s lease)."""
    lost = asyncio.Event()
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answers())
        await accepted.put(writer)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    bus = ControlBus(
        cluster="t",
        member="m1",
        nodes=[("127.0.0.1", server.sockets[0].getsockname()[1])],
        user="guest",
        password="guest",
        lease=2.0,
        on_message=lambda message, to_owner: None,
        on_lost=lost.set,
    )
    loop = asyncio.get_running_loop()
    await bus.connect()
    writer = await asyncio.wait_for(accepted.get(), 5)
    try:
        for _ in range(6):  # 3 s of heartbeats every half interval: alive
            writer.write(frame.marshal(heartbeat.Heartbeat(), 0))
            await asyncio.sleep(0.5)
        assert bus.connected
        assert not lost.is_set()
        silent_from = loop.time()
        await asyncio.wait_for(lost.wait(), 15)
        assert loop.time() - silent_from >= 3.0  # not at the first missed beats
        assert not bus.connected
    finally:
        await bus.close()
        writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_the_bus_reads_the_epochs_recorded_before_it_consumes_the_owner_queue(
    peer: tuple[Peer, ControlBus],
) -> None:
    """A member that connects learns how many epochs were taken before it can
    be handed the owner queue: a new owner's epoch is above all of them."""
    end, bus = peer
    declare = await end.next_method(commands.Queue.Declare)
    while declare.queue != EPOCHS:
        declare = await end.next_method(commands.Queue.Declare)
    assert declare.durable
    assert declare.arguments == {"x-queue-type": "quorum"}  # kept through a node's loss
    first, to_owner = await asyncio.wait_for(end.received.get(), 5)
    assert (first, to_owner) == ({"t": "epoch", "e": RECORDED}, False)
    assert bus.send({"t": "epoch", "e": RECORDED + 1, "m": "m1"}, to="epochs")
    publish, content = await end.next_publish()
    assert (publish.exchange, publish.routing_key) == ("", EPOCHS)
    assert json.loads(b"".join(map(_payload, content[1:]))) == {"t": "epoch", "e": 4, "m": "m1"}
