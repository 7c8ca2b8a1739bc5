"""The gateway gives the CPU away once per loop turn that had client reads
(a short sleep when a connection read keeps a pipe of messages)."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from rabbitflow_broker import cpu_yield as cpu_yield_module
from rabbitflow_broker.cpu_yield import COALESCE_S, PIPELINED, CpuYield
from rabbitflow_broker.relay_pump import Pump
from tests.broker.engine_harness import deliver, method, methods, publish, wire
from tests.broker.fakes import FakeLoop, FakeWriter, RecordingOwner


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_many_reads_in_one_turn_yield_once_on_the_next_turn() -> None:
    calls: list[int] = []
    yielder = CpuYield(lambda: calls.append(1))
    loop = asyncio.get_running_loop()
    for _ in range(50):  # fifty connections read in the same turn
        yielder.after_read(loop)
    assert calls == [], "the yield waits for the next turn: the bytes go on first"
    await _turns(2)
    assert calls == [1]
    yielder.after_read(loop)
    await _turns(2)
    assert calls == [1, 1]
    assert yielder.yields == 2


@pytest.mark.asyncio
async def test_no_reads_no_yield() -> None:
    calls: list[int] = []
    CpuYield(lambda: calls.append(1))
    await _turns(5)
    assert calls == []


def test_a_loop_closed_while_a_yield_was_pending_does_not_stop_the_next_loop() -> None:
    calls: list[int] = []
    yielder = CpuYield(lambda: calls.append(1))
    first = asyncio.new_event_loop()
    yielder.after_read(first)
    first.close()  # the pending callback never runs

    async def read_once() -> None:
        yielder.after_read(asyncio.get_running_loop())
        await _turns(2)

    asyncio.run(read_once())
    assert calls == [1]


@pytest.mark.asyncio
async def test_the_relay_yields_after_client_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from rabbitflow_broker.config import GatewayConfig
    from rabbitflow_broker.frames import PROTOCOL_HEADER
    from rabbitflow_broker.gateway import Gateway
    from tests.broker.fakes import connected_relay

    calls: list[int] = []
    monkeypatch.setattr(cpu_yield_module.cpu_yield, "_give_away", lambda: calls.append(1))
    relay, client_in, upstream_in = connected_relay(Gateway(GatewayConfig(), sink=lambda _e: None))
    await _turns(5)
    before = len(calls)
    client_in.feed_data(PROTOCOL_HEADER)
    await _turns(5)
    assert len(calls) == before + 1
    assert bytes(upstream_in.data) == PROTOCOL_HEADER  # forwarded, not held for the yield
    client_in.feed_eof()
    upstream_in.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


@pytest.mark.asyncio
async def test_a_read_of_a_pipelining_connection_makes_the_next_turn_sleep_instead() -> None:
    yielded: list[int] = []
    slept: list[float] = []
    yielder = CpuYield(lambda: yielded.append(1), slept.append)
    loop = asyncio.get_running_loop()
    yielder.after_read(loop, 0)
    yielder.after_read(loop, PIPELINED)  # another connection, in the same turn
    yielder.after_read(loop, 1)
    await _turns(2)
    assert (slept, yielded) == ([COALESCE_S], []), "one sleep for the turn, no yield besides"
    yielder.after_read(loop, PIPELINED - 1)
    await _turns(2)
    assert (slept, yielded) == ([COALESCE_S], [1]), "a shorter pipe yields, as before"
    assert (yielder.yields, yielder.sleeps) == (2, 1)


def test_the_pump_sleeps_after_reads_of_a_client_with_a_pipe_of_unconfirmed_publishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    yielded: list[int] = []
    slept: list[float] = []
    monkeypatch.setattr(cpu_yield_module.cpu_yield, "_give_away", lambda: yielded.append(1))
    monkeypatch.setattr(cpu_yield_module.cpu_yield, "_sleep", slept.append)
    w = wire(stop_count=1000)
    w.client(method(1, commands.Confirm.Select()))
    w.upstream(method(1, commands.Confirm.SelectOk()))
    owner = RecordingOwner()
    pump = Pump(w.engine, w.gateway, owner)
    upstream = FakeWriter()
    pump.client, pump.upstream = FakeWriter(), upstream
    loop = FakeLoop()
    pump.loop = loop

    pump.client_data(publish(1, "q"))
    loop.turn()
    assert (w.engine.outstanding, slept, yielded) == (1, [], [1])
    pump.client_data(b"".join(publish(1, "q") for _ in range(PIPELINED - 1)))
    loop.turn()
    assert (w.engine.outstanding, slept, yielded) == (PIPELINED, [COALESCE_S], [1])
    sent = [m for _, m in methods(bytes(upstream.data)) if isinstance(m, commands.Basic.Publish)]
    assert len(sent) == PIPELINED  # every publish went on, before the sleep
    pump.upstream_data(method(1, commands.Basic.Ack(delivery_tag=PIPELINED, multiple=True)))
    pump.client_data(publish(1, "q"))
    loop.turn()
    assert (w.engine.outstanding, slept, yielded) == (1, [COALESCE_S], [1, 1])
    assert ("abort", None) not in owner.calls
    assert ("read_client", False) not in owner.calls


def test_unacked_deliveries_count_in_the_pipe_until_acked() -> None:
    w = wire(stop_count=1000)
    w.client(publish(1, "q"), publish(1, "q"))
    w.client(method(1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    w.upstream(method(1, commands.Basic.ConsumeOk("c")))
    w.upstream(deliver(1, "c", 1) + deliver(1, "c", 2))
    assert w.engine.outstanding == 2
    w.client(method(1, commands.Basic.Ack(delivery_tag=1)))
    assert w.engine.outstanding == 1
    w.client(method(1, commands.Basic.Ack(delivery_tag=2)))
    assert w.engine.outstanding == 0
