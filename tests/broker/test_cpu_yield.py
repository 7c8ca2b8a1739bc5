"""The gateway gives the CPU away once per loop turn that had client reads."""

from __future__ import annotations

import asyncio

import pytest

from rabbitflow_broker import cpu_yield as cpu_yield_module
from rabbitflow_broker.cpu_yield import CpuYield


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
