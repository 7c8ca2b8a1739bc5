"""Gateway overhead: the same raw-pika workloads direct to RabbitMQ and through the gateway.

Workloads (each run on a fresh queue declared on its own path, deleted after;
the queues carry ``qpid.flow_stop_count=0, qpid.flow_stop_size=0`` so the
gateway's flow control never engages, and RabbitMQ ignores those arguments):

* ``confirms w100 256B`` / ``confirms w100 4KiB``: SelectConnection with
  publisher confirms and at most 100 unconfirmed; rate and the p50/p99
  publish-to-confirm latency;
* ``confirms w1 256B``: one message at a time, the pure per-message latency
  the gateway adds (a smaller run: ``--latency-messages``); the added-latency
  target is judged here (with a window of 100 the p50 is mostly queueing
  behind the other 99 and is printed for information);
* ``no confirms 256B``: SelectConnection without confirms; the clock stops
  when a confirmed marker sent after the last message is confirmed;
* ``consume prefetch100``: basic.consume with prefetch 100 and one ack per
  delivery from a queue pre-filled (directly) with the messages.

The gateway runs as a ``rabbitflow-broker`` subprocess on free ports, as
it would be deployed (``--profile FILE`` runs it under cProfile).  For each
workload the direct and the gateway run alternate, ``--rounds`` times, and
the median is kept.  Printed: msgs/s per path, through/direct ratio (target
>= 0.85 for each throughput workload), p50/p99 latencies and the added
p50 (target <= 0.5 ms, window 1).

Run: ``.venv/bin/python bench/gateway_overhead.py [--messages N]`` (full run:
100,000 messages per workload; ``--messages 5000`` is a smoke run).
``RABBITMQ_URL`` / ``--url`` and ``--management-url`` pick the broker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pika

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DEFAULT_URL, payload, queue_depth, scratch_queue
from bench._gateway_common import (
    BenchError,
    GatewayProcess,
    consume,
    percentile,
    publish_no_confirms,
    publish_window,
)

NO_FLOW = {"qpid.flow_stop_count": 0, "qpid.flow_stop_size": 0}
RATIO_TARGET = 0.85
ADDED_LATENCY_TARGET_MS = 0.5


@dataclass
class Result:
    """Rounds of one workload on both paths."""

    name: str
    messages: int
    #: Judged on its added latency only (one message in flight is not a throughput test).
    latency_only: bool = False
    #: Ready messages the queue must hold right after the run (None: not checked).
    expect_depth: int | None = None
    rates: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})
    p50_ms: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})
    p99_ms: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "gateway": []})

    def rate(self, path: str) -> float:
        return statistics.median(self.rates[path])

    def ratio(self) -> float:
        return self.rate("gateway") / self.rate("direct")

    def latency(self, path: str, which: str = "p50") -> float | None:
        values = (self.p50_ms if which == "p50" else self.p99_ms)[path]
        return statistics.median(values) if values else None


Workload = Callable[[str, str], tuple[float, list[float] | None]]


def _prefill(url: str, queue: str, body: bytes, messages: int) -> None:
    publish_window(url, queue, body, messages, 500)


def _wait_ready(url: str, queue: str, messages: int) -> None:
    deadline = time.monotonic() + 60
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        while channel.queue_declare(queue, passive=True).method.message_count < messages:
            if time.monotonic() > deadline:
                raise BenchError(f"prefill of {queue} did not reach {messages}")
            time.sleep(0.05)
    finally:
        connection.close()


def run_workload(
    result: Result, workload: Workload, paths: dict[str, str], direct: str, rounds: int
) -> None:
    for round_no in range(rounds):
        order = ["direct", "gateway"] if round_no % 2 == 0 else ["gateway", "direct"]
        for path in order:
            url = paths[path]
            with scratch_queue(url, "gwo", arguments=NO_FLOW) as queue:
                seconds, latencies = workload(url, queue)
                if result.expect_depth is not None:
                    # A confirm the gateway sent before RabbitMQ had the message would show here.
                    depth = queue_depth(direct, queue)
                    if depth != result.expect_depth:
                        raise BenchError(
                            f"{result.name} via {path}: {depth} messages in the queue right "
                            f"after the last confirm, expected {result.expect_depth}"
                        )
            result.rates[path].append(result.messages / seconds)
            if latencies:
                result.p50_ms[path].append(percentile(latencies, 50) * 1000)
                result.p99_ms[path].append(percentile(latencies, 99) * 1000)
            print(
                f"  {result.name:<22} {path:<8} {result.messages / seconds:>10,.0f} msg/s"
                + (f"  p50 {percentile(latencies, 50) * 1000:.3f} ms" if latencies else ""),
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="per workload (100000)")
    parser.add_argument(
        "--latency-messages", type=int, default=None, help="window-1 run (messages / 10)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per workload")
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"),
    )
    parser.add_argument("--profile", help="run the gateway under cProfile, stats to this file")
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=("auto", "asyncio", "uvloop"),
        help="the gateway's --event-loop (auto: uvloop when installed)",
    )
    args = parser.parse_args(argv)
    n = args.messages
    latency_n = args.latency_messages or max(1000, n // 10)
    small, large = payload(256), payload(4096)

    with GatewayProcess(
        args.url, args.management_url, profile=args.profile, event_loop=args.event_loop
    ) as gateway:
        paths = {"direct": args.url, "gateway": gateway.url}
        print(f"gateway subprocess on 127.0.0.1:{gateway.port}; {n:,} messages per workload")

        def window(body: bytes, size: int) -> Workload:
            return lambda url, queue: publish_window(url, queue, body, size, 100)

        def no_confirms(url: str, queue: str) -> tuple[float, list[float] | None]:
            return publish_no_confirms(url, queue, small, n), None

        def consumer(url: str, queue: str) -> tuple[float, list[float] | None]:
            _prefill(args.url, queue, small, n)
            _wait_ready(args.url, queue, n)
            return consume(url, queue, n, 100), None

        workloads: list[tuple[Result, Workload]] = [
            (Result("confirms w100 256B", n, expect_depth=n), window(small, n)),
            (Result("confirms w100 4KiB", n, expect_depth=n), window(large, n)),
            (
                Result("confirms w1 256B", latency_n, latency_only=True, expect_depth=latency_n),
                lambda url, q: publish_window(url, q, small, latency_n, 1),
            ),
            (Result("no confirms 256B", n, expect_depth=n + 1), no_confirms),
            (Result("consume prefetch100", n), consumer),
        ]
        for result, workload in workloads:
            run_workload(result, workload, paths, args.url, args.rounds)

    print()
    print(
        f"{'workload':<22} {'direct/s':>10} {'gateway/s':>10} {'ratio':>6}  "
        f"{'p50 direct':>10} {'p50 gw':>8} {'added':>8}  {'p99 direct':>10} {'p99 gw':>8}"
    )
    ok = True
    for result, _ in workloads:
        ratio = result.ratio()
        line = (
            f"{result.name:<22} {result.rate('direct'):>10,.0f} {result.rate('gateway'):>10,.0f} "
            f"{ratio:>6.2f}"
        )
        mark = ""
        if not result.latency_only and ratio < RATIO_TARGET:
            mark, ok = "  ratio < 0.85", False
        p50_d, p50_g = result.latency("direct"), result.latency("gateway")
        if p50_d is not None and p50_g is not None:
            added = p50_g - p50_d
            line += (
                f"  {p50_d:>8.3f}ms {p50_g:>6.3f}ms {added:>+6.3f}ms"
                f"  {result.latency('direct', 'p99') or 0:>8.3f}ms "
                f"{result.latency('gateway', 'p99') or 0:>6.3f}ms"
            )
            if result.latency_only and added > ADDED_LATENCY_TARGET_MS:
                mark += "  added > 0.5 ms"
                ok = False
        print(line + mark)
    print()
    print(
        f"targets: through/direct >= {RATIO_TARGET} and added p50 <= {ADDED_LATENCY_TARGET_MS} ms: "
        + ("met" if ok else "NOT met")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
