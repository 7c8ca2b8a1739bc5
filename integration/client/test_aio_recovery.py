"""``rabbitflow.aio`` recovery: nothing accepted is lost.

* connection cuts at chosen frames (a fault-injecting proxy in front of the
  shared RabbitMQ): several tasks keep sending through them;
* a gateway killed with SIGKILL and started again on the same port;
* a RabbitMQ restart (a throwaway node; slow).

Every message whose ``send()`` returned arrives, first arrivals in order per
producer (a message whose confirm was lost with the connection may arrive a
second time), and ``close()`` confirms everything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rabbitflow import aio

from ..conftest import Broker
from ._faults import Cut, FaultProxy
from ._gateways import GatewayProcess, require_management
from ._support import declare_queue, drain, numbers

RECOVERY = {
    "rabbitflow.reconnect_initial_delay": 50,
    "rabbitflow.reconnect_max_delay": 500,
    "rabbitflow.reconnect_timeout": 120000,
    "rabbitflow.reconnect_attempts": 1000,  # a node restart takes tens of seconds
    "qpid.flow_control_wait_failure": 120000,
}


def _in_order_once_each(received: list[int], count: int) -> bool:
    first = list(dict.fromkeys(received))
    return first == list(range(1, count + 1))


async def _send_all(
    session: aio.Session, producer: aio.MessageProducer, count: int, pace: float = 0.0
) -> None:
    for n in range(1, count + 1):
        await producer.send(session.create_text_message(str(n)))
        if pace:
            await asyncio.sleep(pace)


async def _run_producers(
    url: str, queues: list[str], count: int, during: Callable[[], object], pace: float = 0.0
) -> int:
    """Send ``count`` messages to each queue from one task per queue, all on
    one connection; ``during()`` runs once a third is sent.  Returns the
    connection's reconnect count."""
    factory = aio.ConnectionFactory(url, properties=RECOVERY)
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        producers = [
            await session.create_producer(await session.create_queue(q), capacity=100)
            for q in queues
        ]
        sending = asyncio.gather(*(_send_all(session, p, count, pace) for p in producers))
        deadline = time.monotonic() + 60
        while min(p.sent_count for p in producers) < count // 3:
            assert time.monotonic() < deadline, "the sends did not start"
            assert not sending.done(), sending
            await asyncio.sleep(0.01)
        await asyncio.to_thread(during)
        await asyncio.wait_for(sending, 240)
        assert all(p.sent_count == count for p in producers)
        # Leaving the block closes everything: it raises unless all is confirmed.
        return connection.reconnect_count


PLANS: dict[str, list[Cut | None]] = {
    "after-publishes": [Cut.after_publishes(1500)],
    "at-channel-open-of-reconnection": [Cut.after_publishes(1500), Cut.at_channel_open(2)],
    "at-first-publish-of-reconnection": [Cut.after_publishes(1500), Cut.after_publishes(0)],
}


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", list(PLANS), ids=list(PLANS))
async def test_tasks_lose_nothing_across_connection_cuts(
    broker: Broker, new_queue: Callable[[str], str], plan: str
) -> None:
    queues = [new_queue(f"aio-cut{n}") for n in range(3)]
    for name in queues:
        declare_queue(broker.url, name)
    count = 1500  # per task: 4,500 on the connection, past every plan's cuts
    with FaultProxy((broker.host, broker.port), PLANS[plan]) as proxy:
        reconnects = await _run_producers(proxy.url(), queues, count, lambda: None)
        assert proxy.cuts == len(PLANS[plan])
    assert reconnects >= 1
    for name in queues:
        received = numbers(drain(broker.url, name))
        assert _in_order_once_each(received, count), (name, len(received))


@pytest.fixture
def gateway(broker: Broker, tmp_path: Path) -> Iterator[GatewayProcess]:
    require_management(broker, pytest.fail)
    gateway = GatewayProcess(broker, tmp_path)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.mark.asyncio
async def test_tasks_lose_nothing_when_the_gateway_is_killed(
    broker: Broker,
    gateway: GatewayProcess,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    queues = [unique_name(f"aio-gwkill{n}") for n in range(2)]
    cleanup_queues.extend(queues)
    for name in queues:
        declare_queue(broker.url, name)
    count = 3000

    def kill_and_restart() -> None:
        gateway.kill()
        time.sleep(0.5)  # the clients see the loss and retry meanwhile
        gateway.start()

    reconnects = await _run_producers(gateway.url, queues, count, kill_and_restart, pace=0.0005)
    assert reconnects >= 1
    for name in queues:
        received = numbers(drain(broker.url, name))
        assert _in_order_once_each(received, count), (name, len(received))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.asyncio
async def test_tasks_lose_nothing_across_a_rabbitmq_restart(
    throwaway_broker: Broker, unique_name: Callable[[str], str]
) -> None:
    node = throwaway_broker.node
    assert node is not None
    queues = [unique_name(f"aio-restart{n}") for n in range(2)]
    count = 4000

    def restart() -> None:
        node.stop()
        node.start()

    # Paced (about 2 ms a message) so that the node goes down mid-stream.
    reconnects = await _run_producers(throwaway_broker.url, queues, count, restart, pace=0.002)
    assert reconnects >= 1
    for name in queues:
        received = numbers(drain(throwaway_broker.url, name))
        assert _in_order_once_each(received, count), (name, len(received))
