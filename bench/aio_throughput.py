"""rabbitflow.aio publishing against aio-pika and against the sync SDK, side by side.

Workload: N non-persistent 256-byte messages to a fresh transient queue,
publisher confirms, a window of 100 unconfirmed messages; the clock stops
when the last message is confirmed.

* ``aio``: ``rabbitflow.aio`` producer of capacity 100, one task sending;
* ``aio-pika``: aio-pika with publisher confirms; 100 tasks each awaiting
  its own publish's confirm (the usual way to keep 100 in flight);
* ``sync``: the sync SDK's ``MessageProducer.send()``, capacity 100.

Each round runs all three (the order rotates per round), each on its own
queue, deleted afterwards.  Prints msg/s and CPU microseconds per message
(process time, all threads) per run, and per round the ratios aio/aio-pika
(target >= 0.9) and aio/sync, then their medians.

Run: ``nice .venv/bin/python bench/aio_throughput.py`` (defaults: 20,000
messages, 3 rounds; ``--url`` or ``RABBITMQ_URL`` picks the broker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rabbitflow
from bench._common import DEFAULT_URL, payload, scratch_queue
from rabbitflow import aio

WINDOW = 100


async def _aio_sdk(url: str, queue: str, count: int, body: bytes) -> None:
    async with await aio.ConnectionFactory(url).create_connection() as connection:
        session = connection.create_session()
        producer = await session.create_producer(await session.create_queue(queue), capacity=WINDOW)
        for _ in range(count):
            await producer.send(
                session.create_bytes_message(body), delivery_mode=rabbitflow.NON_PERSISTENT
            )
        await producer.close()  # waits for the last confirm


async def _aio_pika(url: str, queue: str, count: int, body: bytes) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        remaining = iter(range(count))

        async def worker() -> None:
            for _ in remaining:
                await exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT),
                    routing_key=queue,
                )

        await asyncio.gather(*(worker() for _ in range(WINDOW)))


def _sync_sdk(url: str, queue: str, count: int, body: bytes) -> None:
    with rabbitflow.ConnectionFactory(url).create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=WINDOW)
        for _ in range(count):
            producer.send(
                session.create_bytes_message(body), delivery_mode=rabbitflow.NON_PERSISTENT
            )
        producer.close()


def _measure(run: Callable[[], None]) -> tuple[float, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    run()
    return time.perf_counter() - t0, time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = payload(256)
    count = args.messages
    runs: dict[str, Callable[[str], None]] = {
        "aio": lambda q: asyncio.run(_aio_sdk(args.url, q, count, body)),
        "aio-pika": lambda q: asyncio.run(_aio_pika(args.url, q, count, body)),
        "sync": lambda q: _sync_sdk(args.url, q, count, body),
    }
    names = list(runs)
    vs_pika: list[float] = []
    vs_sync: list[float] = []
    cpu: dict[str, list[float]] = {name: [] for name in names}
    print(f"{'round':>5} {'run':>9} {'msg/s':>9} {'cpu us/msg':>10}")
    for rnd in range(args.rounds):
        order = names[rnd % 3 :] + names[: rnd % 3]
        rates: dict[str, float] = {}
        for name in order:
            with scratch_queue(args.url, f"bench-aio-{name}", durable=False) as queue:
                elapsed, used = _measure(lambda: runs[name](queue))  # noqa: B023
            rates[name] = count / elapsed
            cpu[name].append(used / count * 1e6)
            print(f"{rnd + 1:>5} {name:>9} {rates[name]:>9.0f} {cpu[name][-1]:>10.1f}", flush=True)
        vs_pika.append(rates["aio"] / rates["aio-pika"])
        vs_sync.append(rates["aio"] / rates["sync"])
        print(f"      aio/aio-pika {vs_pika[-1]:.2f}  aio/sync {vs_sync[-1]:.2f}", flush=True)
    print(
        f"median of {args.rounds} rounds: aio/aio-pika {statistics.median(vs_pika):.2f} "
        f"(target >= 0.9), aio/sync {statistics.median(vs_sync):.2f}; CPU us/msg "
        + ", ".join(f"{n} {statistics.median(cpu[n]):.1f}" for n in names)
    )


if __name__ == "__main__":
    main()
