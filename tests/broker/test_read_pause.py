"""The read pause: after a loop turn with client reads, one ``sched_yield``
(a streaming client), one short sleep (a pipelining client) or nothing (a
client waiting for RabbitMQ's answer)."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from rabbitflow_broker.hub.config import ConfigError, GatewayConfig
from rabbitflow_broker.server.read_pause import OFF, PIPELINED, ReadPause
from rabbitflow_broker.server.relay_pump import Pump
from tests.broker.engine_harness import deliver, method, methods, publish, wire
from tests.broker.fakes import FakeLoop, FakeWriter, RecordingOwner, wait_until


class Recorder:
    """The yield and the sleep a policy is given, recorded instead of made."""

    def __init__(self) -> None:
        self.yielded = 0
        self.slept: list[float] = []

    def give_away(self) -> None:
        self.yielded += 1

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def policy(self, pause_us: int = 100) -> ReadPause:
        return ReadPause(pause_us, give_away=self.give_away, sleep=self.sleep)


def test_many_streaming_reads_in_one_turn_yield_once_on_the_next_turn() -> None:
    seen = Recorder()
    pause = seen.policy()
    loop = FakeLoop()
    for _ in range(50):  # fifty connections read in the same turn
        pause.after_read(loop, 0)
    assert seen.yielded == 0, "the yield waits for the next turn: the bytes go on first"
    loop.turn()
    assert seen.yielded == 1
    pause.after_read(loop, 0)
    loop.turn()
    assert (seen.yielded, pause.yields, seen.slept) == (2, 2, [])


def test_no_reads_no_yield() -> None:
    seen = Recorder()
    seen.policy()
    loop = FakeLoop()
    loop.turn()
    assert (seen.yielded, seen.slept) == (0, [])


def test_a_client_waiting_for_its_confirm_is_neither_yielded_for_nor_slept_for() -> None:
    seen = Recorder()
    pause = seen.policy()
    loop = FakeLoop()
    pause.after_read(loop, 1)
    pause.after_read(loop, PIPELINED - 1)
    assert loop.callbacks == []  # straight back to epoll_wait: RabbitMQ's answer wakes it
    assert (seen.yielded, seen.slept) == (0, [])


def test_a_read_of_a_pipelining_connection_makes_the_next_turn_sleep_instead() -> None:
    seen = Recorder()
    pause = seen.policy(250)
    loop = FakeLoop()
    pause.after_read(loop, 0)
    pause.after_read(loop, PIPELINED)  # another connection, in the same turn
    pause.after_read(loop, 1)
    loop.turn()
    assert (seen.slept, seen.yielded) == ([250e-6], 0), "one sleep for the turn, nothing besides"
    pause.after_read(loop, 0)
    loop.turn()
    assert (seen.slept, seen.yielded) == ([250e-6], 1), "a streaming read yields, as before"
    assert (pause.yields, pause.sleeps) == (2, 1)


def test_zero_turns_the_policy_off() -> None:
    seen = Recorder()
    pause = seen.policy(0)
    loop = FakeLoop()
    pause.after_read(loop, 0)
    pause.after_read(loop, PIPELINED)
    assert loop.callbacks == []
    assert not pause.on
    assert not OFF.on
    assert repr(pause) == "ReadPause(pause_us=0)"


def test_a_negative_pause_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        ReadPause(-1)


def test_the_option_sets_the_pause_and_refuses_a_negative_one() -> None:
    assert GatewayConfig().read_pause_us == 100
    assert GatewayConfig(read_pause_us=0).read_pause_us == 0
    with pytest.raises(ConfigError, match="--read-pause-us"):
        GatewayConfig(read_pause_us=-5)


def test_a_loop_closed_while_a_yield_was_pending_does_not_stop_the_next_loop() -> None:
    seen = Recorder()
    pause = seen.policy()
    first = asyncio.new_event_loop()
    pause.after_read(first, 0)
    first.close()  # the pending callback never runs

    async def read_once() -> None:
        pause.after_read(asyncio.get_running_loop(), 0)
        await wait_until(lambda: seen.yielded, "the yield after the read")

    asyncio.run(read_once())
    assert seen.yielded == 1


@pytest.mark.asyncio
async def test_the_relay_carries_out_the_policy_it_is_given_after_client_reads() -> None:
    from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
    from rabbitflow_broker.hub.gateway import Gateway
    from tests.broker.fakes import connected_relay

    seen = Recorder()
    gateway = Gateway(GatewayConfig(), sink=lambda _e: None)
    relay, client_in, upstream_in = connected_relay(gateway, seen.policy())
    deadline = asyncio.get_running_loop().time() + 5
    while upstream_in.protocol is None or client_in.paused:
        assert asyncio.get_running_loop().time() < deadline, "upstream never connected"
        await asyncio.sleep(0.001)
    client_in.feed_data(PROTOCOL_HEADER)
    assert bytes(upstream_in.data) == PROTOCOL_HEADER  # forwarded, not held for the yield
    while seen.yielded == 0:
        assert asyncio.get_running_loop().time() < deadline, "no yield after the read"
        await asyncio.sleep(0.001)
    assert seen.yielded == 1
    client_in.feed_eof()
    upstream_in.feed_eof()
    await asyncio.wait_for(relay.wait_closed(), 5)


def test_the_pump_sleeps_after_reads_of_a_client_with_a_pipe_of_unconfirmed_publishes() -> None:
    seen = Recorder()
    w = wire(stop_count=1000)
    w.client(method(1, commands.Confirm.Select()))
    w.upstream(method(1, commands.Confirm.SelectOk()))
    owner = RecordingOwner()
    pump = Pump(w.engine, w.gateway, owner, seen.policy())
    upstream = FakeWriter()
    pump.client, pump.upstream = FakeWriter(), upstream
    loop = FakeLoop()
    pump.loop = loop

    pump.client_data(publish(1, "q"))
    loop.turn()
    assert (w.engine.outstanding, seen.slept, seen.yielded) == (1, [], 0)
    pump.client_data(b"".join(publish(1, "q") for _ in range(PIPELINED - 1)))
    loop.turn()
    assert (w.engine.outstanding, seen.slept, seen.yielded) == (PIPELINED, [100e-6], 0)
    sent = [m for _, m in methods(bytes(upstream.data)) if isinstance(m, commands.Basic.Publish)]
    assert len(sent) == PIPELINED  # every publish went on, before the sleep
    pump.upstream_data(method(1, commands.Basic.Ack(delivery_tag=PIPELINED, multiple=True)))
    pump.client_data(method(1, commands.Basic.Qos(prefetch_count=1)))
    loop.turn()
    assert (w.engine.outstanding, seen.slept, seen.yielded) == (0, [100e-6], 1)
    assert ("abort", None) not in owner.calls
    assert ("read_client", False) not in owner.calls


def test_a_pump_without_a_policy_never_pauses() -> None:
    w = wire(stop_count=1000)
    pump = Pump(w.engine, w.gateway, RecordingOwner())
    pump.client, pump.upstream = FakeWriter(), FakeWriter()
    loop = FakeLoop()
    pump.loop = loop
    pump.client_data(publish(1, "q"))
    assert pump.read_pause is OFF
    assert loop.callbacks == []


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
