"""An in-memory asyncio transport for ``rabbitflow.aio``'s unit tests: it
records publishes and lets a test play the broker (confirms, nacks,
Channel.Flow, connection.blocked, a lost connection)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import rabbitflow
from rabbitflow import aio
from rabbitflow._exceptions import InvalidDestinationError
from rabbitflow._message import WireProperties
from rabbitflow._transport_base import DETACHED as _DETACHED
from rabbitflow._transport_base import Delivery

from .fakes import encode_all


@dataclass
class Broker:
    queues: set[str] = field(default_factory=set)
    published: list[tuple[int, bytes]] = field(default_factory=list)  # (transport index, body)
    transports: list[FakeAioTransport] = field(default_factory=list)
    refuse_connects: int = 0  # the next N connects fail
    down: set[str] = field(default_factory=set)  # URLs that refuse connects
    props: list[WireProperties] = field(default_factory=list)  # of each publish
    bindings: list[tuple[str, str]] = field(default_factory=list)  # (queue, exchange)
    # transport index -> k: send connection.blocked just before its k-th channel open
    block_at_channel_open: dict[int, int] = field(default_factory=dict)
    # transport indexes that send connection.blocked as their handshake ends
    block_at_connect: set[int] = field(default_factory=set)
    # (transport index, k) -> what to play just after its k-th channel opened,
    # before the SDK has the channel
    after_channel_open: dict[tuple[int, int], Callable[[], Awaitable[None]]] = field(
        default_factory=dict
    )
    # queue name -> what to play while its next queue.declare is on its way
    # (then a channel of a lost connection raises, as the real one does)
    at_queue_declare: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)


class FakeAioChannel:
    def __init__(self, transport: FakeAioTransport, handler: Any) -> None:
        self.transport = transport
        self.handler = handler
        self.closed = False
        self.next_tag = 1
        self.tags: list[int] = []
        self.acks: list[tuple[int, bool]] = []
        self.prefetch: list[int] = []
        self.consuming = False
        self.consumed: list[str] = []  # the queue of each basic.consume
        self.batches: list[int] = []  # size of each publish_many

    async def confirm_select(self) -> None:
        pass

    async def queue_declare(
        self, name: str, *, passive: bool = False, **_kw: Any
    ) -> tuple[str, int, int]:
        play = self.transport.broker.at_queue_declare.pop(name, None)
        if play is not None:
            await play()
            if self.closed or self.transport.lost:
                raise rabbitflow.ConnectionLostError("fake channel is gone")
        if passive and name not in self.transport.broker.queues:
            raise InvalidDestinationError(f"404 no queue {name}")
        name = name or f"amq.gen-{len(self.transport.broker.queues)}"
        self.transport.broker.queues.add(name)
        return name, 0, 0

    async def exchange_declare(self, name: str, kind: str, *, passive: bool = False) -> None:
        pass

    async def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        self.transport.broker.bindings.append((queue, exchange))

    async def queue_delete(self, queue: str) -> None:
        self.transport.broker.queues.discard(queue)

    async def close(self) -> None:
        self.closed = True

    def detach(self) -> None:
        self.handler = _DETACHED

    def publish_many(self, items: list[tuple[str, str, bytes, WireProperties]]) -> None:
        if self.closed or self.transport.lost:
            raise rabbitflow.ProtocolError("channel is closed")
        encode_all(1, items, False)
        self.batches.append(len(items))
        for _exchange, _key, body, props in items:
            self.tags.append(self.next_tag)
            self.next_tag += 1
            self.transport.broker.published.append((self.transport.index, body))
            self.transport.broker.props.append(props)

    def basic_consume_nowait(self, queue: str) -> None:
        self.consuming = True
        self.consumed.append(queue)

    def basic_cancel_nowait(self, on_ok: Callable[[], None] | None = None) -> None:
        self.consuming = False
        if on_ok is not None:
            on_ok()

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        pass

    def ack(self, tag: int, *, multiple: bool) -> None:
        self.acks.append((tag, multiple))

    def qos_nowait(self, count: int, on_ok: Callable[[], None] | None = None) -> None:
        self.prefetch.append(count)
        if on_ok is not None:  # this broker confirms at once
            on_ok()

    # broker side
    def emit_ack(self, tag: int, multiple: bool = False) -> None:
        self.handler.on_confirm(tag, multiple, True)

    def emit_nack(self, tag: int, multiple: bool = False) -> None:
        self.handler.on_confirm(tag, multiple, False)

    def emit_flow(self, active: bool) -> None:
        self.handler.on_flow(active)

    def emit_closed(self, error: rabbitflow.JMSException) -> None:
        self.closed = True
        self.handler.on_channel_closed(error)

    def emit_deliver(self, tag: int, body: bytes) -> None:
        self.handler.on_deliver(
            Delivery(tag, False, "", "q", body, WireProperties(content_type="text/plain"))
        )


class FakeAioTransport:
    def __init__(self, broker: Broker, listener: Any, url: str = "amqp://fake/") -> None:
        self.broker = broker
        self.url = url
        self.listener = listener
        self.channels: list[FakeAioChannel] = []
        self.lost = False
        self.closing = False

    @property
    def index(self) -> int:
        return self.broker.transports.index(self)

    @property
    def alive(self) -> bool:
        return not (self.lost or self.closing)

    async def connect(self) -> None:
        if self.url in self.broker.down:
            raise rabbitflow.ConnectionLostError(f"fake broker {self.url} is down")
        if self.broker.refuse_connects:
            self.broker.refuse_connects -= 1
            raise rabbitflow.ConnectionLostError("fake broker refuses")
        if self.index in self.broker.block_at_connect:
            self.emit_blocked()

    async def open_channel(self, handler: Any) -> FakeAioChannel:
        if not self.alive:
            raise rabbitflow.ConnectionLostError("fake transport is not connected")
        if self.broker.block_at_channel_open.get(self.index) == len(self.channels) + 1:
            self.emit_blocked()
        channel = FakeAioChannel(self, handler)
        self.channels.append(channel)
        play = self.broker.after_channel_open.pop((self.index, len(self.channels)), None)
        if play is not None:
            await play()
        return channel

    async def close(self) -> None:
        self.closing = True

    def emit_lost(self) -> None:
        self.lost = True
        self.listener.on_lost(rabbitflow.ConnectionLostError("fake connection lost"))

    def emit_blocked(self) -> None:
        self.listener.on_blocked("low on memory")

    def emit_unblocked(self) -> None:
        self.listener.on_unblocked()


def fake_factory(
    broker: Broker, properties: dict[str, Any] | None = None, url: str | list[str] = "amqp://fake/"
) -> aio.ConnectionFactory:
    def make(url: str, listener: Any, **_kw: Any) -> FakeAioTransport:
        transport = FakeAioTransport(broker, listener, url)
        broker.transports.append(transport)
        return transport

    return aio.ConnectionFactory(
        url,
        properties=properties,
        _transport_factory=make,  # type: ignore[arg-type]
    )
