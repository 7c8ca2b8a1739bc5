"""Relay enforcement against clients that ignore Channel.Flow (in-memory streams, fake clock)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.base import Frame
from pamqp.body import ContentBody

from rabbitflow_broker.engine.amqp import FRAME_BODY, PROTOCOL_HEADER
from rabbitflow_broker.events import ChannelFlowIgnored, Event
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.relay import PAUSE_MESSAGES
from tests.broker.fakes import FakeTransport, RefreshWatch, connected_relay, wait_until
from tests.broker.frame_reader import FrameReader


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    gateway: Gateway
    clock: Clock
    events: list[Event]
    client_in: FakeTransport
    client_out: FakeTransport
    upstream_out: FakeTransport
    refreshes: RefreshWatch

    async def from_client(
        self,
        *chunks: bytes,
        until: Callable[[], object] | None = None,
        what: str = "the relay to read the client's bytes",
    ) -> None:
        """Feed ``chunks``, then wait until no refresh is due and ``until``
        holds: by default, until the relay has read every byte fed."""
        for chunk in chunks:
            self.client_in.feed_data(chunk)
        done = until or (lambda: not self.client_in.pending)
        await wait_until(lambda: not self.refreshes.pending and done(), what)

    async def unread_from_client(self, *chunks: bytes) -> None:
        """Feed ``chunks`` while the relay does not read the client: they
        stay in the client's socket, unread."""
        await self.from_client(
            *chunks,
            until=lambda: self.client_in.paused and self.client_in.pending == len(chunks),
            what="the client's bytes left unread",
        )


def method(value: Frame, channel: int = 1) -> bytes:
    return pamqp_frame.marshal(value, channel)


def publish(seq: int) -> bytes:
    body = str(seq).encode()
    header = pamqp_header.ContentHeader(0, len(body), commands.Basic.Properties())
    return (
        method(commands.Basic.Publish(exchange="", routing_key="q"))
        + pamqp_frame.marshal(header, 1)
        + pamqp_frame.marshal(ContentBody(body), 1)
    )


def start_ok(*, blocked_capable: bool) -> bytes:
    properties = {"capabilities": {"connection.blocked": blocked_capable}}
    return method(
        commands.Connection.StartOk(
            client_properties=properties, mechanism="PLAIN", response="\x00guest\x00guest"
        ),
        0,
    )


async def _harness(*, blocked_capable: bool) -> AsyncIterator[Harness]:
    events: list[Event] = []
    clock = Clock()
    gateway = Gateway(
        GatewayConfig(flow_enforcement_timeout=1000),
        sink=events.append,
        clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        monotonic=clock,
    )
    gateway.routing.declare_queue("/", "q", {})
    gateway.queue_declared("/", "q", {"qpid.flow_stop_count": 1, "qpid.flow_resume_count": 1})
    relay, client_in, upstream_in = connected_relay(gateway)
    client_out, upstream_out = client_in, upstream_in
    h = Harness(gateway, clock, events, client_in, client_out, upstream_out, RefreshWatch(gateway))
    await h.from_client(
        PROTOCOL_HEADER,
        start_ok(blocked_capable=blocked_capable),
        method(commands.Channel.Open()),
        until=lambda: (
            not client_in.pending
            and any(isinstance(m, commands.Channel.Open) for _, m in upstream_out.methods())
        ),
        what="the Channel.Open to reach RabbitMQ",
    )
    upstream_out.data.clear()
    yield h
    # Unflow everything so a paused client loop reads the EOF at once.
    gateway.queue_deleted("/", "q")
    client_in.feed_eof()
    upstream_in.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in _harness(blocked_capable=False):
        yield h


@pytest_asyncio.fixture
async def capable() -> AsyncIterator[Harness]:
    async for h in _harness(blocked_capable=True):
        yield h


def _bodies(transport: FakeTransport) -> list[int]:
    """Message bodies (sequence numbers) written upstream so far; clears them."""
    buffer, frames = FrameReader().feed(bytes(transport.data))
    transport.data.clear()
    return [int(f.payload(buffer)) for f in frames if f.kind == FRAME_BODY]


def _publishes(frames: list[Frame]) -> int:
    return sum(isinstance(m, commands.Basic.Publish) for m in frames)


@pytest.mark.asyncio
async def test_publish_within_the_timeout_is_forwarded(harness: Harness) -> None:
    await harness.from_client(publish(0), publish(1))  # the second flows the channel
    harness.clock.t += 1.0
    await harness.from_client(publish(2))
    assert _publishes(harness.upstream_out.take_methods()) == 3
    assert not [e for e in harness.events if isinstance(e, ChannelFlowIgnored)]


@pytest.mark.asyncio
async def test_publish_past_the_timeout_closes_the_channel_with_chn_1012(
    harness: Harness,
) -> None:
    await harness.from_client(publish(0), publish(1))
    harness.clock.t += 1.001
    await harness.from_client(publish(2), publish(3))
    upstream = harness.upstream_out.take_methods()
    # What came before the offending publish went upstream, then the close.
    assert _publishes(upstream) == 2
    assert isinstance(upstream[-1], commands.Channel.Close)
    close = [m for m in harness.client_out.take_methods() if isinstance(m, commands.Channel.Close)]
    assert [c.reply_code for c in close] == [406]
    assert "flow control ignored" in close[0].reply_text
    ignored = [e for e in harness.events if isinstance(e, ChannelFlowIgnored)]
    assert [e.channel for e in ignored] == [1]


@pytest.mark.asyncio
async def test_reading_pauses_after_the_bound_and_resumes_when_unflowed(
    harness: Harness,
) -> None:
    # Publish 0 fills the queue (stop 1), publish 1 flows the channel; the
    # 2,001st publish after that (index PAUSE_MESSAGES + 2) crosses the bound.
    crossing = PAUSE_MESSAGES + 2
    flood = b"".join(publish(i) for i in range(crossing + 10))
    await harness.from_client(flood)
    assert _bodies(harness.upstream_out) == list(range(crossing + 1))
    assert harness.client_in.paused
    await harness.unread_from_client(publish(999))
    assert _bodies(harness.upstream_out) == []
    harness.gateway.removed("/", "q", crossing + 1, crossing + 1)
    await harness.from_client()
    # What was left of the chunk goes first, in order, then the next read.
    assert _bodies(harness.upstream_out) == [*range(crossing + 1, crossing + 10), 999]
    assert not harness.client_in.paused


@pytest.mark.asyncio
async def test_capable_client_is_sent_connection_blocked_while_paused(capable: Harness) -> None:
    await capable.from_client(b"".join(publish(i) for i in range(PAUSE_MESSAGES + 3)))
    await capable.unread_from_client(publish(999))
    sent = capable.client_out.take_methods()
    assert any(isinstance(m, commands.Connection.Blocked) for m in sent)
    capable.gateway.removed("/", "q", PAUSE_MESSAGES + 3, PAUSE_MESSAGES + 3)
    await capable.from_client()
    assert any(
        isinstance(m, commands.Connection.Unblocked) for m in capable.client_out.take_methods()
    )


@pytest.mark.asyncio
async def test_client_without_the_capability_gets_no_connection_blocked(
    harness: Harness,
) -> None:
    await harness.from_client(b"".join(publish(i) for i in range(PAUSE_MESSAGES + 3)))
    await harness.unread_from_client(publish(999))
    assert not any(
        isinstance(m, commands.Connection.Blocked) for m in harness.client_out.take_methods()
    )
