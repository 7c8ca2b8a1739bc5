"""What the gateway's depth sources cost when idle: 1,000 queues, 100 of them flowed.

Declares ``--queues`` queues straight on RabbitMQ, ``--flowed`` of them
with ``qpid.flow_stop_count=10`` and 20 messages (so every gateway starts
with them flowed), the rest with a stop far above their depth.  Then, for
each gateway source tree in turn (``--gateway-src NAME=TREE``, repeatable;
default: this tree), runs the gateway idle for ``--seconds`` and reports
the CPU seconds per second of the gateway and of RabbitMQ (``beam.smp``),
beside RabbitMQ's own idle CPU with no gateway at all.  Rounds alternate
the trees.  Compare a tree of the code before the passive-declare poll:

    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/depth_poll_cost.py --gateway-src before=/tmp/before \\
        --gateway-src now=.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gateway_common import GatewayProcess, broker_pid, process_cpu_seconds

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/%2F"
MANAGEMENT = "http://127.0.0.1:15672"


def _declare(names: list[str], flowed: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
    channel = connection.channel()
    for index, name in enumerate(names):
        stop = 10 if index < flowed else 100_000
        channel.queue_declare(name, durable=True, arguments={"qpid.flow_stop_count": stop})
        if index < flowed:
            for _ in range(20):
                channel.basic_publish("", name, b"x")
    connection.close()


def _delete(names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
    channel = connection.channel()
    for name in names:
        channel.queue_delete(name)
    connection.close()


def _cpu_per_second(pids: list[int], seconds: float) -> list[float]:
    before = [process_cpu_seconds(pid) for pid in pids]
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return [(process_cpu_seconds(pid) - b) / elapsed for pid, b in zip(pids, before, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--flowed", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gateway-src", action="append", default=[], metavar="NAME=TREE")
    args = parser.parse_args()
    trees = [item.split("=", 1) for item in args.gateway_src] or [["now", "."]]
    beam = broker_pid(MANAGEMENT, "guest", "guest")
    names = [f"rf-bench-depth-{uuid.uuid4().hex[:6]}-{i}" for i in range(args.queues)]
    _declare(names, args.flowed)
    results: dict[str, list[tuple[float, float]]] = {"no gateway": []}
    try:
        for _ in range(args.rounds):
            idle = _cpu_per_second([beam], args.seconds)[0]
            results["no gateway"].append((0.0, idle))
            for name, tree in trees:
                source = None if Path(tree).resolve() == Path.cwd().resolve() else Path(tree)
                with GatewayProcess(RABBITMQ, MANAGEMENT, source=source) as gateway:
                    time.sleep(5)  # start-up, first snapshot, flowed queues found
                    gw, rabbit = _cpu_per_second([gateway.pid, beam], args.seconds)
                results.setdefault(name, []).append((gw, rabbit))
    finally:
        _delete(names)
    print(f"{args.queues} queues, {args.flowed} flowed, {args.seconds:.0f} s idle per run")
    print(f"{'gateway':<12} {'gateway CPU s/s':>16} {'RabbitMQ CPU s/s':>17}")
    for name, runs in results.items():
        gw = statistics.median(r[0] for r in runs)
        rabbit = statistics.median(r[1] for r in runs)
        print(f"{name:<12} {gw:>16.4f} {rabbit:>17.4f}")


if __name__ == "__main__":
    main()
