"""The cluster bus on the wire: message bodies larger than a frame, the
epochs record, deliveries that come as the bus starts consuming.

RabbitMQ's side is a peer on a loopback socket: it answers the bus's
login and declarations (its Tune offers AMQP's smallest frame_max, 4096)
and reads back, or sends, whole frames.  RabbitMQ ends a connection that
sends a frame over the frame_max agreed (501 FRAME_ERROR), and splits a
delivery's body over as many frames as it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
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
#: The queue that records the last epoch taken.
EPOCHS = "rabbitflow.cluster.t.epochs"
#: The bus's channel for the epochs record (publisher confirms on).
RECORD = 2


def _opening() -> list[tuple[int, Frame]]:
    """What the bus waits for from connecting to its Consume methods, in order."""
    return [
        (0, commands.Connection.Start()),
        (0, commands.Connection.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)),
        (0, commands.Connection.OpenOk()),
        (1, commands.Channel.OpenOk()),
        (1, commands.Exchange.DeclareOk()),
        (1, commands.Queue.DeclareOk("rabbitflow.cluster.t.owner", 0, 0)),
        (1, commands.Queue.DeclareOk("rabbitflow.cluster.t.member.m1", 0, 0)),
        (1, commands.Queue.BindOk()),
        (1, commands.Queue.BindOk()),
        (1, commands.Queue.DeclareOk(EPOCHS, 0, 0)),
        (RECORD, commands.Channel.OpenOk()),
        (RECORD, commands.Confirm.SelectOk()),
    ]


def _answers() -> bytes:
    """Everything the bus waits for from connecting to consuming, in order."""
    answers = [
        *_opening(),
        (1, commands.Basic.ConsumeOk("member")),
        (1, commands.Basic.ConsumeOk("owner")),
    ]
    return b"".join(frame.marshal(value, channel) for channel, value in answers)


def _content(channel: int, body: bytes) -> bytes:
    return frame.marshal(ContentHeader(body_size=len(body)), channel) + frame.marshal(
        ContentBody(body), channel
    )


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
    #: What the bus passed to ``on_record``: ("read", epoch or None) or ("recorded", epoch).
    records: asyncio.Queue[tuple[str, int | None]]
    frames: FrameReader = field(default_factory=lambda: FrameReader(expect_protocol_header=True))
    #: Methods read by :meth:`next_method` and not taken yet, with their channel.
    methods: list[tuple[int, Frame]] = field(default_factory=list)
    #: The channel of the last method :meth:`next_method` returned.
    channel: int = 0

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
                self.channel, method = self.methods.pop(0)
                if isinstance(method, kind):
                    return method
            buffer, refs = self.frames.feed(await asyncio.wait_for(self.reader.read(65536), 5))
            self.methods += [
                (ref.channel, decode_method(ref.payload(buffer)))
                for ref in refs
                if ref.kind == FRAME_METHOD
            ]


def _bus(server: asyncio.Server, **options: Any) -> ControlBus:
    """A bus (not connected yet), member ``m1`` of cluster ``t``, to the
    fake RabbitMQ ``server``; ``options``: its callbacks and settings (by
    default it ignores what it hears and losing its connection)."""
    callbacks: dict[str, Any] = {
        "on_message": lambda message, to_owner: None,
        "on_lost": lambda: None,
    }
    return ControlBus(
        cluster="t",
        member="m1",
        nodes=[("127.0.0.1", server.sockets[0].getsockname()[1])],
        user="guest",
        password="guest",
        lease=2.0,
        **{**callbacks, **options},
    )


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[tuple[Peer, ControlBus]]:
    """A bus connected to a :class:`Peer`, member ``m1`` of cluster ``t``."""
    accepted: asyncio.Queue[Peer] = asyncio.Queue()
    received: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()
    records: asyncio.Queue[tuple[str, int | None]] = asyncio.Queue()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answers())
        await accepted.put(Peer(reader, writer, received, records))

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    bus = _bus(
        server,
        on_message=lambda message, to_owner: received.put_nowait((message, to_owner)),
        on_record=lambda kind, value: records.put_nowait((kind, value)),
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
    bus = _bus(server, on_lost=lost.set)
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


# -- the epochs record ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_epochs_record_is_a_quorum_queue_keeping_the_last_epoch_only(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, _ = peer
    declare = await end.next_method(commands.Queue.Declare)
    while declare.queue != EPOCHS:
        declare = await end.next_method(commands.Queue.Declare)
    assert declare.durable
    assert declare.arguments == {
        "x-queue-type": "quorum",  # kept through a node's loss
        "x-max-length": 1,  # a new record takes the place of the last
        "x-overflow": "drop-head",
    }
    await end.next_method(commands.Confirm.Select)  # records are confirmed
    assert end.channel == RECORD


@pytest.mark.asyncio
async def test_reading_the_record_puts_it_back_and_hands_over_its_epoch(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, bus = peer
    assert bus.read_epochs()
    get = await end.next_method(commands.Basic.Get)
    assert (end.channel, get.queue, get.no_ack) == (RECORD, EPOCHS, False)
    body = json.dumps({"t": "epoch", "e": 7, "m": "m0"}).encode()
    got = commands.Basic.GetOk(delivery_tag=9, exchange="", routing_key=EPOCHS, message_count=0)
    end.writer.write(frame.marshal(got, RECORD) + _content(RECORD, body))
    assert await asyncio.wait_for(end.records.get(), 5) == ("read", 7)
    reject = await end.next_method(commands.Basic.Reject)  # left in place, for the next owner
    assert (end.channel, reject.delivery_tag, reject.requeue) == (RECORD, 9, True)
    assert bus.read_epochs()
    await end.next_method(commands.Basic.Get)
    end.writer.write(frame.marshal(commands.Basic.GetEmpty(), RECORD))
    assert await asyncio.wait_for(end.records.get(), 5) == ("read", None)  # never recorded


@pytest.mark.asyncio
async def test_a_record_no_member_wrote_still_says_an_epoch_was_taken(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, bus = peer
    assert bus.read_epochs()
    await end.next_method(commands.Basic.Get)
    got = commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key=EPOCHS, message_count=0)
    end.writer.write(frame.marshal(got, RECORD) + _content(RECORD, b"not json"))
    assert await asyncio.wait_for(end.records.get(), 5) == ("read", 1)  # never epoch 1's own


@pytest.mark.asyncio
async def test_an_epoch_is_recorded_once_rabbitmq_confirms_it(
    peer: tuple[Peer, ControlBus],
) -> None:
    end, bus = peer
    assert bus.record_epoch(8)
    publish, content = await end.next_publish()
    assert (publish.exchange, publish.routing_key) == ("", EPOCHS)
    assert json.loads(b"".join(map(_payload, content[1:]))) == {"t": "epoch", "e": 8, "m": "m1"}
    await asyncio.sleep(0.1)
    assert end.records.empty()  # not before RabbitMQ confirms it
    end.writer.write(frame.marshal(commands.Basic.Ack(delivery_tag=1), RECORD))
    assert await asyncio.wait_for(end.records.get(), 5) == ("recorded", 8)


async def _close(bus: ControlBus, server: asyncio.Server, ends: list[asyncio.StreamWriter]) -> None:
    await bus.close()
    for end in ends:
        end.close()
        with contextlib.suppress(OSError):
            await end.wait_closed()
    server.close()
    await server.wait_closed()


@pytest.mark.asyncio
async def test_a_record_read_without_an_answer_drops_the_bus() -> None:
    """No answer (the epochs queue has no leader: a node failing) is no
    answer at all: the bus is dropped, the member owns nothing."""
    lost = asyncio.Event()
    ends: list[asyncio.StreamWriter] = []

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answers())
        ends.append(writer)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    records: list[tuple[str, int | None]] = []
    bus = _bus(
        server,
        on_lost=lost.set,
        on_record=lambda kind, value: records.append((kind, value)),
        record_timeout=0.3,
    )
    await bus.connect()
    try:
        assert bus.read_epochs()
        await asyncio.wait_for(lost.wait(), 5)
        assert not bus.connected
        assert records == []
    finally:
        await _close(bus, server, ends)


@pytest.mark.asyncio
async def test_deliveries_before_the_owner_queues_consume_ok_are_handed_over() -> None:
    """A message waiting in the member queue is delivered at once after its
    Consume-Ok, before the owner queue's: the bus connects and hands it over."""
    body = json.dumps({"t": "state", "m": "a", "e": 7, "on": [], "stops": [], "d": []}).encode()
    wire = b"".join(frame.marshal(value, channel) for channel, value in _opening())
    wire += frame.marshal(commands.Basic.ConsumeOk("member"), 1)
    wire += frame.marshal(
        commands.Basic.Deliver("member", 1, False, "rabbitflow.cluster.t", "all"), 1
    )
    wire += _content(1, body)
    wire += frame.marshal(commands.Basic.ConsumeOk("owner"), 1)

    ends: list[asyncio.StreamWriter] = []

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire)
        ends.append(writer)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    got: list[tuple[dict[str, Any], bool]] = []
    bus = _bus(server, on_message=lambda message, to_owner: got.append((message, to_owner)))
    try:
        await bus.connect()
        assert bus.connected
        assert got == [(json.loads(body), False)]
    finally:
        await _close(bus, server, ends)
