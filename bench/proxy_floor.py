"""The floor under any proxy at window 1: direct, socat, a uvloop forwarder and the gateway.

A publisher that waits for each confirm (window 1, 256-byte bodies, pika's
SelectConnection) runs, in turn, direct to RabbitMQ and through three
processes in front of it:

* ``socat``: a C forwarder (``TCP-LISTEN`` ... ``TCP:``), one process per
  round that serves the one connection and exits; its CPU is the rusage
  ``wait4`` returns;
* ``forwarder``: ``bench/_forwarder.py``, a byte forwarder on uvloop with the
  gateway's socket settings and no protocol work;
* ``gateway``: ``rabbitflow-broker`` as ``bench/gateway_overhead.py`` runs it.

Each adds two loopback hops per message (the publish in, the confirm out),
so the first two show what those hops cost on this machine whatever the
proxy does with the bytes: the gateway's figures are read against them.
The paths take turns, ``--rounds`` times, the order rotating each round;
the summary keeps the median.  Printed per path: messages a second, through
÷ direct, p50 publish-to-confirm latency and what the proxy adds to it, and
the proxy's CPU per message (utime + stime).

Run: ``.venv/bin/python bench/proxy_floor.py [--messages 10000] [--rounds 5]``.
``socat`` must be on ``PATH`` (Debian's package ``socat``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pika

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DEFAULT_URL, NO_FLOW, load_average, payload, scratch_queue
from bench._gateway_common import (
    BenchError,
    GatewayProcess,
    percentile,
    process_cpu_seconds,
    publish_window,
)
from rabbitflow_broker.server.rabbitmq_node import free_port, wait_for_amqp

BODY = payload(256)
PATHS = ("direct", "socat", "forwarder", "gateway")


class _Sample:
    """One path's rounds: rates, p50 latencies (s) and proxy CPU seconds per message."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.p50s: list[float] = []
        self.cpu: list[float] = []


def _url_via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    credentials = netloc[0] + "@" if len(netloc) == 2 else ""
    return parts._replace(netloc=f"{credentials}127.0.0.1:{port}").geturl()


@contextlib.contextmanager
def _socat(host: str, port: int) -> Iterator[tuple[int, Callable[[], float]]]:
    """A one-connection socat; yields its port and a function giving its CPU once it exited."""
    listen = free_port()
    process = subprocess.Popen(
        [
            "socat",
            "-d",
            "-d",
            f"TCP-LISTEN:{listen},bind=127.0.0.1,reuseaddr,nodelay",
            f"TCP:{host}:{port},nodelay",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    used: list[float] = []

    def cpu() -> float:
        if not used:
            # socat exits when the connection it served closes.
            _pid, _status, usage = os.wait4(process.pid, 0)
            process.returncode = 0
            used.append(usage.ru_utime + usage.ru_stime)
        return used[0]

    try:
        # A probe connection would be the one it serves: wait for its "listening" line.
        assert process.stderr is not None
        for line in process.stderr:
            if "listening on" in line:
                break
        else:
            raise BenchError("socat exited before listening")
        yield listen, cpu
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


@contextlib.contextmanager
def _forwarder(host: str, port: int) -> Iterator[tuple[int, int]]:
    listen = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench._forwarder", str(listen), host, str(port)],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        wait_for_amqp("127.0.0.1", listen, 30)
        yield listen, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def _run(sample: _Sample, url: str, queue: str, messages: int, cpu: Callable[[], float]) -> None:
    seconds, latencies = publish_window(url, queue, BODY, messages, 1)
    sample.rates.append(messages / seconds)
    sample.p50s.append(percentile(latencies, 50))
    sample.cpu.append(cpu() / messages)


class _Paths:
    """The four paths to one RabbitMQ, the long-running proxies started once."""

    def __init__(self, url: str, gateway: GatewayProcess, forwarder: tuple[int, int]) -> None:
        self.host, self.port = _host_port(url)
        self.url = url
        self.gateway = gateway
        self.forwarder_port, self.forwarder_pid = forwarder

    def run(self, path: str, sample: _Sample, queue: str, messages: int) -> None:
        if path == "direct":
            _run(sample, self.url, queue, messages, lambda: 0.0)
        elif path == "socat":
            with _socat(self.host, self.port) as (listen, cpu):
                _run(sample, _url_via(self.url, listen), queue, messages, cpu)
        else:
            pid, via = (
                (self.gateway.pid, self.gateway.url)
                if path == "gateway"
                else (self.forwarder_pid, _url_via(self.url, self.forwarder_port))
            )
            start = process_cpu_seconds(pid)
            _run(sample, via, queue, messages, lambda: process_cpu_seconds(pid) - start)


def _summary(samples: dict[str, _Sample]) -> None:
    direct_rate = statistics.median(samples["direct"].rates)
    direct_p50 = statistics.median(samples["direct"].p50s)
    print(f"{'path':<10} {'msg/s':>8} {'÷ direct':>9} {'p50':>9} {'added':>9} {'proxy CPU':>12}")
    for path, sample in samples.items():
        rate, p50 = statistics.median(sample.rates), statistics.median(sample.p50s)
        cpu = "" if path == "direct" else f"{statistics.median(sample.cpu) * 1e6:7.1f} µs/msg"
        added = "" if path == "direct" else f"{(p50 - direct_p50) * 1e3:+.3f}ms"
        print(
            f"{path:<10} {rate:>8,.0f} {rate / direct_rate:>9.2f} {p50 * 1e3:>7.3f}ms "
            f"{added:>9} {cpu:>12}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="per round and path (10000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, median kept (5)")
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"),
    )
    args = parser.parse_args(argv)
    if args.messages < 1 or args.rounds < 1:
        parser.error("--messages and --rounds must be at least 1")
    if shutil.which("socat") is None:
        parser.error("socat is not on PATH (Debian: apt-get install socat)")
    samples = {path: _Sample() for path in PATHS}
    with (
        GatewayProcess(args.url, args.management_url) as gateway,
        _forwarder(*_host_port(args.url)) as forwarder,
        scratch_queue(args.url, "floor", arguments=NO_FLOW) as queue,
    ):
        print(f"gateway from {gateway.imported_from}; load average {load_average()}")
        paths = _Paths(args.url, gateway, forwarder)
        for path in PATHS:  # one untimed warm-up each
            paths.run(path, _Sample(), queue, min(500, args.messages))
        for round_no in range(args.rounds):
            shift = round_no % len(PATHS)
            for path in PATHS[shift:] + PATHS[:shift]:
                paths.run(path, samples[path], queue, args.messages)
                _purge(args.url, queue)
    print(
        f"{args.messages:,} messages per round, {args.rounds} rounds, medians; "
        f"load average at the end {load_average()}"
    )
    _summary(samples)
    return 0


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def _purge(url: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_purge(queue)
    finally:
        connection.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        sys.exit(f"proxy_floor: {exc}")
