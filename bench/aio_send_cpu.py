"""The client's own CPU per send, without a broker: rabbitflow.aio and the
sync SDK over an in-memory transport that confirms every publish at once.

No network, no RabbitMQ, no I/O thread (the sync transport's posted work
runs inline): what is left is the SDK's bookkeeping per message (checks,
headers, the window, the publish step, the confirm), so two source trees
can be compared on a shared, noisy machine far more tightly than through a
broker.  256-byte bytes messages, capacity 100 (``--capacity``: with
5,000, the sends never wait, and rabbitflow.aio's yields to the loop and
bounded publish steps are what is measured).

Each run is its own process; with ``--baseline-src TREE`` every round runs
the baseline tree's SDK and this tree's, alternating, and the summary gives
the medians and their ratio (this tree / baseline; below 1 is cheaper).

Run: ``.venv/bin/python bench/aio_send_cpu.py --baseline-src /tmp/client-before``
(defaults: 50,000 sends per run, 3 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_BODY = b"x" * 256


class _SyncChannel:
    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.tag = 0
        self.closed = False

    def confirm_select(self) -> None:
        pass

    def queue_declare(self, name: str, **_kw: Any) -> tuple[str, int, int]:
        return name, 0, 0

    def publish_many(self, items: list[Any], mandatory: bool) -> None:
        self.tag += len(items)
        self.handler.on_confirm(self.tag, True, True)

    def close(self) -> None:
        self.closed = True

    def detach(self) -> None:
        pass


class _SyncTransport:
    alive = True

    def __init__(self, url: str, listener: Any, **_kw: Any) -> None:
        self.lost = False
        self.closing = False

    def connect(self) -> None:
        pass

    def open_channel(self, handler: Any) -> _SyncChannel:
        return _SyncChannel(handler)

    def post(self, fn: Any) -> None:
        fn()

    def call_later(self, delay: float, fn: Any) -> None:
        pass

    def close(self) -> None:
        self.closing = True


class _AioChannel:
    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.tag = 0
        self.closed = False

    async def confirm_select(self) -> None:
        pass

    async def queue_declare(self, name: str, **_kw: Any) -> tuple[str, int, int]:
        return name, 0, 0

    def publish_many(self, items: list[Any]) -> None:
        self.tag += len(items)
        asyncio.get_running_loop().call_soon(self.handler.on_confirm, self.tag, True, True)

    async def close(self) -> None:
        self.closed = True

    def detach(self) -> None:
        pass


class _AioTransport:
    alive = True

    def __init__(self, url: str, listener: Any, **_kw: Any) -> None:
        self.lost = False
        self.closing = False

    async def connect(self) -> None:
        pass

    async def open_channel(self, handler: Any) -> _AioChannel:
        return _AioChannel(handler)

    async def close(self) -> None:
        self.closing = True


def _sync_run(sends: int, capacity: int) -> float:
    import rabbitflow

    factory = rabbitflow.ConnectionFactory("amqp://fake/", _transport_factory=_SyncTransport)  # type: ignore[arg-type]
    connection = factory.create_connection()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("q"), capacity=capacity)
    messages = [session.create_bytes_message(_BODY) for _ in range(sends)]
    start = time.process_time()
    for message in messages:
        producer.send(message)
    cpu = time.process_time() - start
    connection.close()
    return cpu / sends * 1e6


async def _aio_run(sends: int, capacity: int) -> float:
    from rabbitflow import aio

    factory = aio.ConnectionFactory("amqp://fake/", _transport_factory=_AioTransport)  # type: ignore[arg-type]
    connection = await factory.create_connection()
    session = connection.create_session()
    producer = await session.create_producer(await session.create_queue("q"), capacity=capacity)
    messages = [session.create_bytes_message(_BODY) for _ in range(sends)]
    start = time.process_time()
    for message in messages:
        await producer.send(message)
    while producer.unconfirmed_count:
        await asyncio.sleep(0)
    cpu = time.process_time() - start
    await connection.close()
    return cpu / sends * 1e6


def _child(sends: int, capacity: int) -> int:
    result = {"sync": _sync_run(sends, capacity), "aio": asyncio.run(_aio_run(sends, capacity))}
    print(json.dumps(result))
    return 0


def _run(sends: int, capacity: int, src: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(src) / "client"), *filter(None, [env.get("PYTHONPATH")])]
        )
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(sends), str(capacity)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=600,
    )
    answer: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def main() -> int:
    """Parse arguments, run the rounds, print the table and medians."""
    if sys.argv[1:2] == ["--child"]:
        return _child(int(sys.argv[2]), int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--capacity", type=int, default=100, help="the producers' window (5000: sends never wait)"
    )
    parser.add_argument("--baseline-src", help="a source tree to compare against")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.baseline_src:
        trees.insert(0, ("baseline", args.baseline_src))
    results: dict[str, dict[str, list[float]]] = {t: {"sync": [], "aio": []} for t, _ in trees}
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else list(reversed(trees))
        for name, src in order:
            got = _run(args.sends, args.capacity, src)
            for driver, value in got.items():
                results[name][driver].append(value)
            print(
                f"round {rnd + 1} {name:<10} sync {got['sync']:6.2f} us/send  aio {got['aio']:6.2f}"
            )
    print()
    for driver in ("sync", "aio"):
        medians = {t: statistics.median(results[t][driver]) for t, _ in trees}
        line = "  ".join(f"{t} {m:.2f} us/send" for t, m in medians.items())
        if args.baseline_src:
            line += f"  ratio {medians['this tree'] / medians['baseline']:.3f}"
        print(f"{driver:<5} median CPU per send: {line}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
