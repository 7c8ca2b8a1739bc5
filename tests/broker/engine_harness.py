"""Drive a connection engine with byte strings: no sockets, no event loop."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.base import Frame
from pamqp.body import ContentBody

from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.engine.connection import Actions, Engine, EngineSettings
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from tests.broker.frame_reader import FrameReader, decode_method


def method(channel: int, value: Frame) -> bytes:
    return pamqp_frame.marshal(value, channel)


def message(
    channel: int,
    head: Frame,
    body: bytes,
    properties: commands.Basic.Properties | None = None,
) -> bytes:
    header = pamqp_header.ContentHeader(0, len(body), properties or commands.Basic.Properties())
    return (
        method(channel, head)
        + pamqp_frame.marshal(header, channel)
        + pamqp_frame.marshal(ContentBody(body), channel)
    )


def publish(channel: int, queue: str, body: bytes = b"x", exchange: str = "") -> bytes:
    return message(channel, commands.Basic.Publish(exchange=exchange, routing_key=queue), body)


def deliver(channel: int, consumer: str, tag: int, body: bytes = b"x") -> bytes:
    return message(channel, commands.Basic.Deliver(consumer, tag, False, "", "q"), body)


def methods(data: bytes) -> list[tuple[int, Frame]]:
    """The method frames in ``data`` as (channel, pamqp method)."""
    _buffer, frames = FrameReader().feed(data)
    return [(f.channel, decode_method(f.payload(data))) for f in frames if f.kind == 1]


@dataclass
class Wire:
    """An engine with a gateway, a clock and what it sent each way."""

    gateway: Gateway
    engine: Engine
    events: list[Event]
    now: float = 100.0
    to_client: bytearray = field(default_factory=bytearray)
    to_upstream: bytearray = field(default_factory=bytearray)
    last: Actions | None = None

    def _take(self, actions: Actions) -> Actions:
        self.to_client += b"".join(actions.to_client)
        self.to_upstream += b"".join(actions.to_upstream)
        for event in actions.events:
            self.gateway.emit(event)
        self.last = actions
        return actions

    def client(self, *chunks: bytes) -> Actions:
        for chunk in chunks:
            self._take(self.engine.receive_client(chunk, self.now))
        assert self.last is not None
        return self.last

    def upstream(self, *chunks: bytes) -> Actions:
        for chunk in chunks:
            self._take(self.engine.receive_upstream(chunk, self.now))
        assert self.last is not None
        return self.last

    def refresh(self) -> Actions:
        return self._take(self.engine.refresh(self.now))

    def upstream_failed(self, cause: str) -> Actions:
        return self._take(self.engine.upstream_failed(self.now, cause))

    def tick(self, now: float) -> Actions:
        self.now = now
        return self._take(self.engine.tick(now))

    def client_methods(self) -> list[tuple[int, Frame]]:
        got = methods(bytes(self.to_client))
        self.to_client.clear()
        return got

    def upstream_methods(self) -> list[tuple[int, Frame]]:
        data = bytes(self.to_upstream).removeprefix(PROTOCOL_HEADER)
        self.to_upstream.clear()
        return methods(data)

    def codes(self) -> list[str]:
        return [event.code for event in self.events if not event.code.startswith("QUE")]

    def open_channel(self, number: int) -> None:
        self.client(method(number, commands.Channel.Open()))
        self.upstream(method(number, commands.Channel.OpenOk()))
        self.to_client.clear()
        self.to_upstream.clear()


START_OK = method(
    0,
    commands.Connection.StartOk(
        client_properties={"capabilities": {"connection.blocked": True}},
        mechanism="PLAIN",
        response="\x00alice\x00secret",
    ),
)


def wire(
    *,
    stop_count: int = 1,
    enforcement: float | None = 5.0,
    handshake: float | None = 10.0,
    login: bool = True,
    connected: bool = True,
    node: str = "",
) -> Wire:
    """An engine relaying one logged-in connection; queue ``q`` flows above ``stop_count``."""
    events: list[Event] = []
    clock = [100.0]
    gateway = Gateway(
        GatewayConfig(),
        sink=events.append,
        clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        monotonic=lambda: clock[0],
    )
    gateway.routing.declare_queue("/", "q", {})
    gateway.queue_declared(
        "/", "q", {"qpid.flow_stop_count": stop_count, "qpid.flow_resume_count": stop_count}
    )
    engine = Engine(
        gateway,
        number=7,
        remote_host="127.0.0.1",
        remote_port=50514,
        settings=EngineSettings(flow_enforcement_timeout=enforcement, handshake_timeout=handshake),
    )
    w = Wire(gateway, engine, events)
    w._take(engine.start(w.now))
    if connected:
        w._take(engine.upstream_connected(w.now, node))
    if login:
        w.client(PROTOCOL_HEADER)
        w.upstream(method(0, commands.Connection.Start()))
        w.client(START_OK)
        w.upstream(method(0, commands.Connection.Tune(frame_max=131072)))
        w.client(
            method(0, commands.Connection.TuneOk(frame_max=131072)),
            method(0, commands.Connection.Open(virtual_host="/")),
        )
        w.upstream(method(0, commands.Connection.OpenOk()))
        w.to_client.clear()
        w.to_upstream.clear()
        w.open_channel(1)
    return w
