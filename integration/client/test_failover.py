"""Several gateways: a producer given their URLs fails over when the one it
uses is killed (SIGKILL) mid-stream, for the sync SDK and ``rabbitflow.aio``.

Two real gateways in front of the shared RabbitMQ, and a first URL where
nothing listens (connecting skips it).  The producer keeps sending while
the gateway it uses dies, goes on through the other, and loses nothing:
every accepted message arrives, first arrivals in send order, and any
message that arrives twice carries the redelivered flag on a copy (it was
re-sent because its confirm was lost with the killed gateway).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

import rabbitflow
from rabbitflow import aio
from rabbitflow._message import REDELIVERED_HEADER
from rabbitflow_broker.server.rabbitmq_node import free_port

from ..conftest import Broker
from ._gateways import GatewayProcess, gateways, require_management
from ._support import declare_queue

RECOVERY = {
    "rabbitflow.reconnect_initial_delay": 50,
    "rabbitflow.reconnect_max_delay": 500,
    "rabbitflow.reconnect_timeout": 60000,
    "rabbitflow.reconnect_attempts": 100,
    "qpid.flow_control_wait_failure": 60000,
}
COUNT = 3000
PACE = 0.0005  # about 2,000 messages a second: the kill lands mid-stream


def _drain_flagged(url: str, queue: str) -> list[tuple[int, bool]]:
    """Every message of ``queue`` as (number, flagged redelivered), in queue order."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        out: list[tuple[int, bool]] = []
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            flagged = (props.headers or {}).get(REDELIVERED_HEADER) is True
            out.append((int(body.decode()), flagged))
    finally:
        connection.close()


def _assert_nothing_lost(received: list[tuple[int, bool]], count: int, resent: int) -> None:
    first = list(dict.fromkeys(n for n, _ in received))
    assert first == list(range(1, count + 1)), f"{len(first)} distinct of {count}"
    copies = Counter(n for n, _ in received)
    flagged = {n for n, f in received if f}
    unflagged_twice = sorted(n for n, c in copies.items() if c > 1 and n not in flagged)
    assert not unflagged_twice, f"arrived twice, no copy flagged redelivered: {unflagged_twice}"
    assert all(c <= 2 for c in copies.values()), copies.most_common(3)
    # Each message re-sent after the kill went out once more, flagged.
    assert sum(f for _, f in received) == resent


def _urls(pair: list[GatewayProcess]) -> list[str]:
    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"  # nothing listens
    return [nowhere, pair[0].url, pair[1].url]


@pytest.fixture
def queue(broker: Broker, new_queue: Callable[[str], str]) -> str:
    require_management(broker, pytest.fail)
    name = new_queue("failover")
    declare_queue(broker.url, name)
    return name


def test_a_producer_fails_over_to_the_other_gateway_and_loses_nothing(
    broker: Broker, queue: str, tmp_path: Path
) -> None:
    with gateways(broker, tmp_path, 2) as pair:
        factory = rabbitflow.ConnectionFactory(_urls(pair), properties=RECOVERY)
        with factory.create_connection() as connection:
            assert connection.url == pair[0].url  # the dead first URL was skipped
            session = connection.create_session()
            producer = session.create_producer(session.create_queue(queue), capacity=100)
            killer = threading.Thread(target=pair[0].kill)
            stop = threading.Event()
            for n in range(1, COUNT + 1):
                producer.send(session.create_text_message(str(n)))
                if n == COUNT // 3:
                    killer.start()
                stop.wait(PACE)
            killer.join()
            assert producer.sent_count == COUNT
            assert connection.reconnect_count >= 1
            assert connection.url == pair[1].url
            # Leaving the block closes the producer: it raises unless all is confirmed.
        assert producer.unconfirmed_count == 0
    _assert_nothing_lost(_drain_flagged(broker.url, queue), COUNT, producer.resent_count)


@pytest.mark.asyncio
async def test_an_aio_producer_fails_over_to_the_other_gateway_and_loses_nothing(
    broker: Broker, queue: str, tmp_path: Path
) -> None:
    with gateways(broker, tmp_path, 2) as pair:
        factory = aio.ConnectionFactory(_urls(pair), properties=RECOVERY)
        async with await factory.create_connection() as connection:
            assert connection.url == pair[0].url
            session = connection.create_session()
            producer = await session.create_producer(
                await session.create_queue(queue), capacity=100
            )
            killing: asyncio.Future[None] | None = None
            for n in range(1, COUNT + 1):
                await producer.send(session.create_text_message(str(n)))
                if n == COUNT // 3:
                    killing = asyncio.ensure_future(asyncio.to_thread(pair[0].kill))
                await asyncio.sleep(PACE)
            assert killing is not None
            await killing
            assert producer.sent_count == COUNT
            assert connection.reconnect_count >= 1
            assert connection.url == pair[1].url
        assert producer.unconfirmed_count == 0
    _assert_nothing_lost(_drain_flagged(broker.url, queue), COUNT, producer.resent_count)
