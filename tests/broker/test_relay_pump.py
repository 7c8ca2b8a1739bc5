"""The relay's hot path: reads into the engine, the engine's actions out."""

from __future__ import annotations

from collections.abc import Iterable

from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.engine.connection import Engine, EngineSettings
from rabbitflow_broker.engine.ports import VIEW_MIN, Actions, Chunk, Out
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.read_pause import ReadPause
from rabbitflow_broker.server.relay_pump import Pump
from tests.broker.fakes import FakeLoop, FakeWriter, RecordingOwner


def _pump(clock: list[float]) -> tuple[Pump, RecordingOwner, FakeWriter, FakeWriter, list[object]]:
    events: list[object] = []
    gateway = Gateway(GatewayConfig(), sink=events.append, monotonic=lambda: clock[0])
    engine = Engine(gateway, number=1, settings=EngineSettings(handshake_timeout=10.0))
    owner = RecordingOwner()
    pump = Pump(engine, gateway, owner, ReadPause(100, give_away=lambda: None))
    client, upstream = FakeWriter(), FakeWriter()
    pump.client, pump.upstream = client, upstream
    return pump, owner, client, upstream, events


def test_a_read_goes_through_the_engine_in_one_write_and_asks_for_one_yield() -> None:
    clock = [100.0]
    pump, owner, client, upstream, _ = _pump(clock)
    loop = pump.loop = FakeLoop()
    pump.perform(pump.engine.start(clock[0]))
    assert owner.calls == [("set_timer", 110.0)]  # the handshake deadline, from the clock
    pump.perform(pump.engine.upstream_connected(clock[0]))
    assert owner.calls == [("set_timer", 110.0)]  # the same deadline is not set again
    pump.client_data(PROTOCOL_HEADER[:5])
    pump.client_data(PROTOCOL_HEADER[5:])
    assert bytes(upstream.data) == PROTOCOL_HEADER
    assert client.data == b""
    assert len(loop.callbacks) == 1  # one yield for the turn, however many reads


def test_the_timer_fires_into_the_engine_and_a_close_stops_there() -> None:
    clock = [0.0]
    pump, owner, client, upstream, _ = _pump(clock)
    pump.perform(pump.engine.start(clock[0]))
    pump.perform(pump.engine.upstream_connected(clock[0]))
    owner.calls.clear()
    clock[0] = 10.5  # past the handshake timeout
    pump.tick()
    assert b"handshake timeout" in bytes(client.data)  # Connection.Close to the client
    assert ("read_client", False) in owner.calls  # nothing more is read meanwhile
    assert upstream.data == b""


def test_actions_are_carried_out_in_order_and_a_close_ends_them() -> None:
    pump, owner, client, upstream, _events = _pump([0.0])
    actions = Actions()
    actions.to_upstream += [b"a", b"b"]
    actions.to_client += [b"c"]
    actions.close = True
    actions.read_client = False
    actions.timer = 5.0
    pump.perform(actions)
    assert (bytes(upstream.data), bytes(client.data)) == (b"ab", b"c")
    assert owner.calls == [("abort", None)]  # neither reading nor the timer after a close


def test_nothing_is_written_to_a_closing_transport_and_reads_after_close_are_ignored() -> None:
    pump, owner, client, upstream, _ = _pump([0.0])
    upstream.closed = True
    actions = Actions()
    actions.to_upstream.append(b"late")
    pump.perform(actions)
    assert upstream.data == b""
    pump.closing = True
    pump.client_data(PROTOCOL_HEADER)
    pump.upstream_data(b"\x01\x00\x00")
    pump.tick()
    assert (upstream.data, client.data, owner.calls) == (b"", b"", [])


class _CountingWriter(FakeWriter):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, data: bytes | memoryview) -> None:
        self.calls.append("write")
        super().write(data)

    def writelines(self, list_of_data: Iterable[bytes | memoryview]) -> None:
        self.calls.append("writelines")
        super().writelines(list_of_data)


def test_several_chunks_go_in_one_writelines_and_one_chunk_in_one_write() -> None:
    pump, _owner, _client, _, _ = _pump([0.0])
    upstream = _CountingWriter()
    pump.upstream = upstream
    actions = Actions()
    actions.to_upstream += [b"a", memoryview(b"xyz")[1:]]
    pump.perform(actions)
    actions = Actions()
    actions.to_upstream.append(b"!")
    pump.perform(actions)
    assert upstream.calls == ["writelines", "write"]
    assert bytes(upstream.data) == b"ayz!"


def test_long_runs_of_a_read_are_forwarded_as_views_short_ones_copied() -> None:
    parts: list[Chunk] = []
    out = Out(parts)
    read = bytes(range(256)) * 20
    out.keep(read, 0, 100)
    out.add(b"own frame")
    out.keep(read, 100, 100 + VIEW_MIN)
    out.add(b"own frame")
    out.keep(read, 0, len(read))
    out.flush()
    assert [type(part) for part in parts] == [bytes, bytes, memoryview, bytes, bytes]
    assert parts[4] is read  # a whole read goes on as it came
    assert b"".join(parts) == read[:100] + b"own frame" + read[100 : 100 + VIEW_MIN] + (
        b"own frame" + read
    )
