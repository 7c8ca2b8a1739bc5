"""Which AMQP library carries ``rabbitflow.aio``: pika's asyncio adapter or aiormq.

Both publish the same workload on one asyncio loop, side by side in one run:
N non-persistent 256-byte messages to a fresh transient queue with
publisher confirms and a window of 100 unconfirmed publishes; the clock
stops at the last confirm.  Rounds alternate the order (pika, aiormq, then
aiormq, pika ...).  Prints messages/s, CPU microseconds per message (process
time) and the aiormq/pika ratio per round and its median.

Run: ``nice .venv/bin/python bench/aio_transport_choice.py`` (defaults:
20,000 messages, 3 rounds; ``--url`` or ``RABBITMQ_URL`` picks the broker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiormq
import pika
from pika.adapters.asyncio_connection import AsyncioConnection

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DEFAULT_URL, payload, scratch_queue

WINDOW = 100


async def run_pika(url: str, queue: str, count: int, body: bytes) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[object] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()
    conn = AsyncioConnection(
        pika.URLParameters(url),
        on_open_callback=opened.set_result,
        on_open_error_callback=lambda _c, e: opened.set_exception(RuntimeError(str(e))),
        custom_ioloop=loop,
    )
    await opened
    ch_future: asyncio.Future[object] = loop.create_future()
    conn.channel(on_open_callback=ch_future.set_result)
    channel = await ch_future
    state = {"sent": 0, "confirmed": 0}
    props = pika.BasicProperties(delivery_mode=1)

    def fill() -> None:
        while state["sent"] < count and state["sent"] - state["confirmed"] < WINDOW:
            channel.basic_publish("", queue, body, props)  # type: ignore[attr-defined]
            state["sent"] += 1

    def on_confirm(frame: object) -> None:
        method = frame.method  # type: ignore[attr-defined]
        tag = method.delivery_tag
        state["confirmed"] = tag if method.multiple else max(state["confirmed"] + 1, tag)
        if state["confirmed"] >= count and not done.done():
            done.set_result(None)
        else:
            fill()

    selected: asyncio.Future[None] = loop.create_future()
    channel.confirm_delivery(on_confirm, callback=lambda _f: selected.set_result(None))  # type: ignore[attr-defined]
    await selected
    cpu0, t0 = time.process_time(), time.perf_counter()
    fill()
    await done
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    closed: asyncio.Future[None] = loop.create_future()
    conn.add_on_close_callback(lambda *_: closed.set_result(None))
    conn.close()
    await closed
    return elapsed, cpu


async def run_aiormq(url: str, queue: str, count: int, body: bytes) -> tuple[float, float]:
    conn = await aiormq.connect(url)
    channel = await conn.channel(publisher_confirms=True)
    window = asyncio.Semaphore(WINDOW)
    props = aiormq.spec.Basic.Properties(delivery_mode=1)
    pending: set[asyncio.Future[Any]] = set()

    def release(_f: asyncio.Future[Any]) -> None:
        window.release()

    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(count):
        await window.acquire()
        # wait=False: do not wait for the socket drain; the confirm is awaited below.
        publish: Any = channel.basic_publish  # wait=False: aiormq >= 7.2, not in its stubs
        fut: asyncio.Future[Any] = asyncio.ensure_future(
            publish(body, routing_key=queue, properties=props, wait=False)
        )
        fut.add_done_callback(release)
        pending.add(fut)
        fut.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*list(pending))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await conn.close()
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = payload(256)
    ratios: list[float] = []
    print(f"{'round':>5} {'library':>8} {'msg/s':>9} {'cpu us/msg':>10}")
    for rnd in range(args.rounds):
        order = [("pika", run_pika), ("aiormq", run_aiormq)]
        if rnd % 2:
            order.reverse()
        rates: dict[str, float] = {}
        for name, runner in order:
            with scratch_queue(args.url, "bench-aio-transport", durable=False) as queue:
                elapsed, cpu = asyncio.run(runner(args.url, queue, args.messages, body))
            rates[name] = args.messages / elapsed
            print(
                f"{rnd + 1:>5} {name:>8} {rates[name]:>9.0f} {cpu / args.messages * 1e6:>10.1f}",
                flush=True,
            )
        ratios.append(rates["aiormq"] / rates["pika"])
    print(f"aiormq / pika (median of {args.rounds} rounds): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
