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
  delivery from a queue pre-filled (directly, before the clock and the CPU
  meters start) with the messages.

The gateway runs as a ``rabbitflow-broker`` subprocess on free ports, as
it would be deployed (``--profile FILE`` runs it under cProfile).  For each
workload the paths (direct, then each gateway) take turns, ``--rounds``
times, the order rotating each round, and the summary keeps the MEDIAN of
the rounds.  Printed: msgs/s per path, through/direct ratio (target >= 0.90
for each throughput workload), p50/p99 latencies and the added p50 (target
<= 0.5 ms, window 1), and the CPU each side spent during the timed part of
each round, from ``/proc/<pid>/stat`` (utime + stime): the gateway's CPU per
relayed message (µs), the gateway's CPU divided by RabbitMQ's in the same
interval (RabbitMQ = the ``beam.smp`` of the node the management API
answers for), RabbitMQ's CPU per message on each path, and the pika
client's (this process's CPU, ``time.process_time()``).  The broker is
often shared: its CPU includes whatever else it serves meanwhile, so read
the figures beside ``uptime``.

``--gateway-src [LABEL=]TREE`` (repeatable) runs a gateway from another
checkout (``TREE/broker_plugin`` etc. first on the subprocess's
``PYTHONPATH``) instead of this tree's; give it twice to compare two
versions in one run, e.g. ``--gateway-src new=. --gateway-src old=../old``.
``--gateway-args LABEL='OPTIONS'`` (repeatable) adds options to that
gateway's command line, to compare settings of one tree side by side, e.g.
``--gateway-src p0=. --gateway-args "p0=--read-pause-us 0" --gateway-src p100=.``.

Run: ``.venv/bin/python bench/gateway_overhead.py [--messages N] [--rounds R]``
(full run: 100,000 messages per workload, 5 rounds; ``--messages 5000
--rounds 1`` is a smoke run; ``--workload NAME``, repeatable, runs only
the workloads named).  ``RABBITMQ_URL`` / ``--url`` and
``--management-url`` pick the broker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pika

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    DEFAULT_URL,
    NO_FLOW,
    load_average,
    payload,
    queue_depth,
    scratch_queue,
)
from bench._gateway_common import (
    BenchError,
    GatewayProcess,
    broker_pid,
    consume,
    percentile,
    process_cpu_seconds,
    publish_no_confirms,
    publish_window,
)

RATIO_TARGET = 0.90
ADDED_LATENCY_TARGET_MS = 0.5
DIRECT = "direct"


def _per_path() -> dict[str, list[float]]:
    return {}


@dataclass
class Result:
    """Rounds of one workload on every path (``direct`` and each gateway label)."""

    name: str
    messages: int
    #: Judged on its added latency only (one message in flight is not a throughput test).
    latency_only: bool = False
    #: Ready messages the queue must hold right after the run (None: not checked).
    expect_depth: int | None = None
    rates: dict[str, list[float]] = field(default_factory=_per_path)
    p50_ms: dict[str, list[float]] = field(default_factory=_per_path)
    p99_ms: dict[str, list[float]] = field(default_factory=_per_path)
    #: Per round: the gateway's CPU µs per message (gateway paths only).
    gateway_us: dict[str, list[float]] = field(default_factory=_per_path)
    #: Per round: the gateway's CPU / RabbitMQ's CPU over the same interval.
    gateway_over_broker: dict[str, list[float]] = field(default_factory=_per_path)
    #: Per round: RabbitMQ's CPU µs per message (every path).
    broker_us: dict[str, list[float]] = field(default_factory=_per_path)
    #: Per round: this process's CPU µs per message (the pika client, every path).
    client_us: dict[str, list[float]] = field(default_factory=_per_path)

    def rate(self, path: str) -> float:
        return statistics.median(self.rates[path])

    def ratio(self, path: str) -> float:
        return self.rate(path) / self.rate(DIRECT)

    def median(self, series: dict[str, list[float]], path: str) -> float | None:
        values = series.get(path)
        return statistics.median(values) if values else None


@dataclass(frozen=True)
class Workload:
    """``run(url, queue) -> (seconds, latencies | None)``, timed and metered.

    ``prepare(queue)`` (optional) runs first, directly against RabbitMQ,
    outside the clock and the CPU meters.
    """

    run: Callable[[str, str], tuple[float, list[float] | None]]
    prepare: Callable[[str], None] | None = None


@dataclass(frozen=True)
class GatewaySource:
    """A gateway path: its label and the tree it runs from (None: this tree)."""

    label: str
    tree: Path | None


def _parse_source(text: str) -> GatewaySource:
    label, sep, tree = text.partition("=")
    if not sep:
        label, tree = "", text
    path = Path(tree).expanduser()
    return GatewaySource(label or path.resolve().name, path)


def _parse_args(text: str) -> tuple[str, list[str]]:
    label, sep, options = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=OPTIONS, got {text!r}")
    return label, shlex.split(options)


def _prefill(url: str, queue: str, body: bytes, messages: int) -> None:
    publish_window(url, queue, body, messages, 500)
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


class CpuMeter:
    """CPU seconds of RabbitMQ and the gateways between ``start`` and ``stop``."""

    def __init__(self, broker: int, gateways: dict[str, int]) -> None:
        self._broker = broker
        self._gateways = gateways

    def sample(self, path: str) -> tuple[float, float]:
        gateway = process_cpu_seconds(self._gateways[path]) if path in self._gateways else 0.0
        return process_cpu_seconds(self._broker), gateway


def run_workload(
    result: Result,
    workload: Workload,
    paths: dict[str, str],
    *,
    direct: str,
    rounds: int,
    meter: CpuMeter,
) -> None:
    labels = list(paths)
    for round_no in range(rounds):
        shift = round_no % len(labels)
        for path in labels[shift:] + labels[:shift]:
            url = paths[path]
            with scratch_queue(url, "gwo", arguments=NO_FLOW) as queue:
                if workload.prepare is not None:
                    workload.prepare(queue)
                broker0, gateway0 = meter.sample(path)
                client0 = time.process_time()
                seconds, latencies = workload.run(url, queue)
                client1 = time.process_time()
                broker1, gateway1 = meter.sample(path)
                if result.expect_depth is not None:
                    # A confirm the gateway sent before RabbitMQ had the message would show here.
                    depth = queue_depth(direct, queue)
                    if depth != result.expect_depth:
                        raise BenchError(
                            f"{result.name} via {path}: {depth} messages in the queue right "
                            f"after the last confirm, expected {result.expect_depth}"
                        )
            _record(
                result,
                path,
                seconds,
                latencies,
                broker_cpu=broker1 - broker0,
                gateway_cpu=gateway1 - gateway0,
                client_cpu=client1 - client0,
            )


def _record(
    result: Result,
    path: str,
    seconds: float,
    latencies: list[float] | None,
    *,
    broker_cpu: float,
    gateway_cpu: float,
    client_cpu: float,
) -> None:
    rate = result.messages / seconds
    result.rates.setdefault(path, []).append(rate)
    broker_us = broker_cpu / result.messages * 1e6
    result.broker_us.setdefault(path, []).append(broker_us)
    client_us = client_cpu / result.messages * 1e6
    result.client_us.setdefault(path, []).append(client_us)
    line = f"  {result.name:<22} {path:<8} {rate:>10,.0f} msg/s"
    if latencies:
        p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
        result.p50_ms.setdefault(path, []).append(p50)
        result.p99_ms.setdefault(path, []).append(p99)
        line += f"  p50 {p50:.3f} ms"
    line += f"  client {client_us:5.1f}  RabbitMQ {broker_us:6.1f} µs/msg"
    if path != DIRECT:
        gateway_us = gateway_cpu / result.messages * 1e6
        result.gateway_us.setdefault(path, []).append(gateway_us)
        line += f"  gateway {gateway_us:6.1f} µs/msg"
        if broker_cpu > 0:
            result.gateway_over_broker.setdefault(path, []).append(gateway_cpu / broker_cpu)
            line += f" ({gateway_cpu / broker_cpu:.2f}x RabbitMQ)"
    print(line, flush=True)


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


WORKLOADS = (
    "confirms w100 256B",
    "confirms w100 4KiB",
    "confirms w1 256B",
    "no confirms 256B",
    "consume prefetch100",
)
"""The workloads in the order they run; ``--workload`` picks among these names."""


def standard_workloads(url: str, n: int, latency_n: int) -> list[tuple[Result, Workload]]:
    """The workloads of :data:`WORKLOADS`, in order: ``n`` messages each
    (``latency_n`` at window 1); the consumer's queue is filled from ``url``."""
    small, large = payload(256), payload(4096)

    def window(body: bytes, size: int, width: int) -> Workload:
        return Workload(lambda url, queue: publish_window(url, queue, body, size, width))

    def no_confirms(url: str, queue: str) -> tuple[float, list[float] | None]:
        return publish_no_confirms(url, queue, small, n), None

    def consumer(url: str, queue: str) -> tuple[float, list[float] | None]:
        return consume(url, queue, n, 100), None

    workloads: list[tuple[Result, Workload]] = [
        (Result("confirms w100 256B", n, expect_depth=n), window(small, n, 100)),
        (Result("confirms w100 4KiB", n, expect_depth=n), window(large, n, 100)),
        (
            Result("confirms w1 256B", latency_n, latency_only=True, expect_depth=latency_n),
            window(small, latency_n, 1),
        ),
        (Result("no confirms 256B", n, expect_depth=n + 1), Workload(no_confirms)),
        (
            Result("consume prefetch100", n),
            Workload(consumer, prepare=lambda queue: _prefill(url, queue, small, n)),
        ),
    ]
    assert [result.name for result, _ in workloads] == list(WORKLOADS)
    return workloads


def print_summary(workloads: list[tuple[Result, Workload]], gateways: list[str]) -> dict[str, bool]:
    """Print the medians per workload and gateway; return whether each gateway meets the targets."""
    verdicts: dict[str, bool] = {}
    for label in gateways:
        ok = True
        print()
        print(f"gateway {label!r}: medians of the rounds")
        print(
            f"{'workload':<22} {'direct/s':>10} {'gateway/s':>10} {'ratio':>6}  "
            f"{'p50 direct':>10} {'p50 gw':>8} {'added':>8}  {'p99 direct':>10} {'p99 gw':>8}"
        )
        for result, _ in workloads:
            ratio = result.ratio(label)
            line = (
                f"{result.name:<22} {result.rate(DIRECT):>10,.0f} {result.rate(label):>10,.0f} "
                f"{ratio:>6.2f}"
            )
            mark = ""
            if not result.latency_only and ratio < RATIO_TARGET:
                mark, ok = f"  ratio < {RATIO_TARGET}", False
            p50_d, p50_g = result.median(result.p50_ms, DIRECT), result.median(result.p50_ms, label)
            if p50_d is not None and p50_g is not None:
                added = p50_g - p50_d
                line += (
                    f"  {p50_d:>8.3f}ms {p50_g:>6.3f}ms {added:>+6.3f}ms"
                    f"  {_fmt(result.median(result.p99_ms, DIRECT), '>8.3f', 'ms')} "
                    f"{_fmt(result.median(result.p99_ms, label), '>6.3f', 'ms')}"
                )
                if result.latency_only and added > ADDED_LATENCY_TARGET_MS:
                    mark += f"  added > {ADDED_LATENCY_TARGET_MS} ms"
                    ok = False
            print(line + mark)
        print()
        print(
            f"{'workload':<22} {'gw µs/msg':>10} {'gw/RabbitMQ CPU':>16}  "
            f"{'RabbitMQ µs/msg direct':>22} {'via gw':>7}  "
            f"{'client µs/msg direct':>20} {'via gw':>7}"
        )
        for result, _ in workloads:
            print(
                f"{result.name:<22} {_fmt(result.median(result.gateway_us, label), '>10.1f')} "
                f"{_fmt(result.median(result.gateway_over_broker, label), '>16.2f')}  "
                f"{_fmt(result.median(result.broker_us, DIRECT), '>22.1f')} "
                f"{_fmt(result.median(result.broker_us, label), '>7.1f')}  "
                f"{_fmt(result.median(result.client_us, DIRECT), '>20.1f')} "
                f"{_fmt(result.median(result.client_us, label), '>7.1f')}"
            )
        verdicts[label] = ok
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="per workload (100000)")
    parser.add_argument(
        "--latency-messages", type=int, default=None, help="window-1 run (messages / 10)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds per workload, median kept (5)"
    )
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"),
    )
    parser.add_argument(
        "--gateway-src",
        action="append",
        type=_parse_source,
        default=[],
        metavar="[LABEL=]TREE",
        help="run a gateway from this source tree (repeatable; default: this tree)",
    )
    parser.add_argument(
        "--gateway-args",
        action="append",
        type=_parse_args,
        default=[],
        metavar="LABEL=OPTIONS",
        help="extra command-line options for the gateway of that label (repeatable)",
    )
    parser.add_argument("--profile", help="run the gateway under cProfile, stats to this file")
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=("auto", "asyncio", "uvloop"),
        help="the gateway's --event-loop (auto: uvloop when installed)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        metavar="NAME",
        help="run only this workload (repeatable, e.g. 'no confirms 256B'; default: all)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    unknown = sorted(set(args.workload or ()) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown --workload {unknown}; choose from {list(WORKLOADS)}")
    sources: list[GatewaySource] = args.gateway_src or [GatewaySource("gateway", None)]
    labels = [source.label for source in sources]
    if len(set(labels)) != len(labels) or DIRECT in labels:
        parser.error(f"gateway labels must be distinct and not {DIRECT!r}: {labels}")
    extra = dict(args.gateway_args)
    if set(extra) - set(labels):
        parser.error(f"--gateway-args for unknown labels {sorted(set(extra) - set(labels))}")
    if args.profile and len(sources) > 1:
        parser.error("--profile takes one gateway")
    n = args.messages
    latency_n = args.latency_messages or max(1000, n // 10)
    parts = urlsplit(args.url)
    broker = broker_pid(
        args.management_url, unquote(parts.username or "guest"), unquote(parts.password or "guest")
    )

    with contextlib.ExitStack() as stack:
        paths = {DIRECT: args.url}
        pids: dict[str, int] = {}
        for source in sources:
            gateway = stack.enter_context(
                GatewayProcess(
                    args.url,
                    args.management_url,
                    profile=args.profile,
                    event_loop=args.event_loop,
                    source=source.tree,
                    extra_args=extra.get(source.label, ()),
                )
            )
            paths[source.label] = gateway.url
            pids[source.label] = gateway.pid
            print(
                f"gateway {source.label!r}: subprocess pid {gateway.pid} on "
                f"127.0.0.1:{gateway.port}, code from {gateway.imported_from}"
                + (f", options {shlex.join(extra[source.label])}" if source.label in extra else "")
            )
        print(
            f"RabbitMQ beam.smp pid {broker}; {n:,} messages per workload, "
            f"{args.rounds} rounds, median kept; load average at the start: {load_average()}"
        )
        meter = CpuMeter(broker, pids)

        workloads = standard_workloads(args.url, n, latency_n)
        if args.workload:
            workloads = [(r, w) for r, w in workloads if r.name in args.workload]
        for result, workload in workloads:
            run_workload(result, workload, paths, direct=args.url, rounds=args.rounds, meter=meter)

    print(f"load average at the end: {load_average()}")
    verdicts = print_summary(workloads, labels)
    print()
    for label, ok in verdicts.items():
        print(
            f"targets for {label!r}: through/direct >= {RATIO_TARGET} and added p50 <= "
            f"{ADDED_LATENCY_TARGET_MS} ms: " + ("met" if ok else "NOT met")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
