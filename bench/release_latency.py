"""How long after a queue is drained straight on RabbitMQ the gateway releases it.

A producer publishes through the gateway and waits for each confirm; the
queue (``qpid.flow_stop_count=100``, ``qpid.flow_resume_count=50``) is
emptied straight on RabbitMQ with ``basic.get`` each time the gateway
reports it flowed.  Per cycle it prints the seconds from "RabbitMQ holds
nothing" to the gateway's QUE-1004 (0 when the gateway had already released
the queue during the drain, once depth fell under resume), for a classic
and a quorum queue, for each gateway source tree (``--gateway-src
NAME=TREE``, repeatable; default this tree)::

    .venv/bin/python bench/release_latency.py --cycles 5 \\
        --gateway-src before=/tmp/before --gateway-src now=.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gateway_common import GatewayProcess

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/%2F"
MANAGEMENT = "http://127.0.0.1:15672"
TIMEOUT_S = 30.0


class Publisher(threading.Thread):
    """Publishes through the gateway, one confirmed message at a time, until stopped."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.halt = threading.Event()

    def run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.confirm_delivery()
        while not self.halt.is_set():
            channel.basic_publish("", self.queue, b"x")
        connection.close()


def _flowed(admin_port: int, queue: str) -> bool:
    url = f"http://127.0.0.1:{admin_port}/api/queues/%2F/{queue}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return bool(json.load(response)["flowStopped"])


def _releases(log: Path, queue: str) -> int:
    if not log.exists():
        return 0
    return sum(
        1
        for line in log.read_text(encoding="utf-8").splitlines()
        if '"QUE-1004"' in line and json.loads(line).get("queue") == queue
    )


def _released(log: Path, queue: str, count: int) -> bool:
    return _releases(log, queue) >= count


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def measure(
    gateway: GatewayProcess, log: Path, arguments: Mapping[str, object], cycles: int
) -> list[float]:
    """Release latencies of one queue over ``cycles`` fill-and-drain cycles."""
    queue = f"rf-bench-release-{uuid.uuid4().hex[:8]}"
    setup = pika.BlockingConnection(pika.URLParameters(gateway.url))
    setup.channel().queue_declare(
        queue,
        durable=True,
        arguments={**arguments, "qpid.flow_stop_count": 100, "qpid.flow_resume_count": 50},
    )
    setup.close()
    publisher = Publisher(gateway.url, queue)
    publisher.start()
    direct = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
    channel = direct.channel()
    latencies: list[float] = []
    try:
        for cycle in range(cycles):
            _wait(lambda: _flowed(gateway.admin_port, queue), "the queue to flow")
            while channel.basic_get(queue, auto_ack=True)[0] is not None:
                pass
            start = time.monotonic()
            _wait(functools.partial(_released, log, queue, cycle + 1), "the release")
            latencies.append(time.monotonic() - start)
    finally:
        publisher.halt.set()
        channel.queue_purge(queue)  # unblocks a publisher waiting on a held confirm
        publisher.join(timeout=10)
        channel.queue_delete(queue)
        direct.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--gateway-src", action="append", default=[], metavar="NAME=TREE")
    args = parser.parse_args()
    trees = [item.split("=", 1) for item in args.gateway_src] or [["now", "."]]
    for name, tree in trees:
        source = None if Path(tree).resolve() == Path.cwd().resolve() else Path(tree)
        with tempfile.TemporaryDirectory() as scratch:
            log = Path(scratch) / "events.jsonl"
            with GatewayProcess(
                RABBITMQ, MANAGEMENT, source=source, extra_args=["--event-log", str(log)]
            ) as gateway:
                for kind, arguments in (("classic", {}), ("quorum", {"x-queue-type": "quorum"})):
                    latencies = measure(gateway, log, arguments, args.cycles)
                    print(
                        f"{name:<8} {kind:<8} median {statistics.median(latencies):6.3f} s"
                        f"  max {max(latencies):6.3f} s  cycles "
                        + " ".join(f"{value:.3f}" for value in latencies)
                    )


if __name__ == "__main__":
    main()
