"""Cluster overhead: a 2-member cluster against one standalone gateway, same workloads.

The raw-pika workloads of ``bench/gateway_overhead.py`` (imported from it,
not copied) run on three paths in one process, rounds alternating (the
order rotates each round) and the median of the rounds kept:

* ``direct``: straight to RabbitMQ;
* ``single``: one ``rabbitflow-broker`` subprocess;
* ``cluster``: two ``rabbitflow-broker --cluster NAME`` subprocesses;
  the client connects to the member that does not own the cluster's
  accounting, so every allowance request crosses the control bus.

Each round's queue carries flow thresholds (``qpid.flow_stop_count`` of
four times the messages, resume at twice), so the gateways account every
message and a cluster member asks the owner for allowance batches
(``--cluster-batch``, default 100), but no queue ever stops.  RabbitMQ
ignores those arguments on the direct path.

Printed per workload: msgs/s on each path and through ÷ direct (target
≥ 0.90 for the cluster on each throughput workload); the gateways' CPU per
message from ``/proc/PID/stat`` (utime + stime, the cluster's the sum over
both members; target: the cluster within 10 % of the standalone gateway);
and the control messages the members sent per 1,000 messages of the
workload (``controlMessages.sent`` of ``GET /api/cluster``, summed over the
members, heartbeats included; the idle rate of heartbeats is printed first).
A last table splits the cluster's CPU per message between the member the
clients use and the owner, and gives each path's CPU per message less its
idle rate (CPU a second with no client, measured for 10 s at the start, times
the run's length): the part that grows with the messages.

Run: ``.venv/bin/python bench/cluster_overhead.py [--messages N] [--rounds R]``
(full run: 50,000 messages per workload, 5 rounds; ``--messages 5000
--rounds 1`` is a smoke run; ``--workload NAME``, repeatable).  Read the
figures beside the load average it prints: the machine is often shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pika.exceptions

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DEFAULT_URL, load_average, queue_depth, scratch_queue
from bench._gateway_common import (
    BenchError,
    GatewayProcess,
    broker_pid,
    process_cpu_seconds,
)
from bench.gateway_overhead import (
    DIRECT,
    RATIO_TARGET,
    WORKLOADS,
    Result,
    Workload,
    _record,
    standard_workloads,
)

SINGLE = "single"
CLUSTER = "cluster"
#: The cluster's CPU per message may exceed the standalone gateway's by this share.
CPU_TARGET = 0.10
#: Seconds of idle measured at the start (CPU time comes in 10 ms ticks).
IDLE_S = 10.0
#: Tries to open a round's connection before giving up.
CONNECT_ATTEMPTS = 3


@contextlib.contextmanager
def _fresh_queue(url: str, what: str, arguments: dict[str, int]) -> Iterator[str]:
    """A scratch queue declared through ``url``, the connection tried again on failure
    (seen once on the shared machine: a connection refused between two rounds)."""
    with contextlib.ExitStack() as stack:
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                queue = stack.enter_context(scratch_queue(url, "clo", arguments=arguments))
            except pika.exceptions.AMQPConnectionError as exc:
                if attempt == CONNECT_ATTEMPTS:
                    raise
                print(f"  {what} could not connect ({exc!r}); trying again", flush=True)
                time.sleep(1.0)
            else:
                break
        yield queue


class Target:
    """One way to RabbitMQ: its URL, the gateway processes behind it and their admin ports."""

    def __init__(self, url: str, pids: list[int], admin_ports: list[int]) -> None:
        self.url = url
        self.pids = pids
        self.admin_ports = admin_ports

    def cpu(self) -> float:
        return sum(self.cpu_each())

    def cpu_each(self) -> list[float]:
        return [process_cpu_seconds(pid) for pid in self.pids]

    def control_sent(self) -> int:
        return sum(int(cluster_view(port)["controlMessages"]["sent"]) for port in self.admin_ports)


def cluster_view(admin_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/api/cluster", timeout=5) as reply:
        return dict(json.loads(reply.read()))


def wait_for_cluster(members: list[GatewayProcess], timeout: float = 30.0) -> str:
    """Wait until each member lists both and they agree on an owner; return its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            views = [cluster_view(m.admin_port) for m in members]
            owners = {v["owner"] for v in views}
            if (
                len(owners) == 1
                and None not in owners
                and all(len(v["members"]) == len(members) for v in views)
            ):
                return str(owners.pop())
        time.sleep(0.1)
    raise BenchError(f"the {len(members)} members did not form one cluster in {timeout} s")


def run_workload(
    result: Result,
    workload: Workload,
    paths: dict[str, Target],
    *,
    direct: str,
    broker: int,
    rounds: int,
    thresholds: dict[str, int],
    control: list[float],
    split: list[tuple[float, ...]],
) -> None:
    """Run ``workload``'s rounds; ``split`` gets, per cluster round, its
    seconds and each member's CPU seconds (the member the clients use first)."""
    labels = list(paths)
    for round_no in range(rounds):
        shift = round_no % len(labels)
        for label in labels[shift:] + labels[:shift]:
            path = paths[label]
            with _fresh_queue(path.url, f"{result.name:<22} {label:<8}", thresholds) as queue:
                if workload.prepare is not None:
                    workload.prepare(queue)
                sent0 = path.control_sent() if path.admin_ports else 0
                broker0, each0 = process_cpu_seconds(broker), path.cpu_each()
                client0 = time.process_time()
                seconds, latencies = workload.run(path.url, queue)
                client1 = time.process_time()
                broker1, each1 = process_cpu_seconds(broker), path.cpu_each()
                gateway0, gateway1 = sum(each0), sum(each1)
                if label == CLUSTER:
                    split.append((seconds, *(b - a for a, b in zip(each0, each1, strict=True))))
                sent1 = path.control_sent() if path.admin_ports else 0
                if result.expect_depth is not None:
                    depth = queue_depth(direct, queue)
                    if depth != result.expect_depth:
                        raise BenchError(
                            f"{result.name} via {label}: {depth} messages in the queue after "
                            f"the last confirm, expected {result.expect_depth}"
                        )
            _record(
                result,
                label,
                seconds,
                latencies,
                broker_cpu=broker1 - broker0,
                gateway_cpu=gateway1 - gateway0,
                client_cpu=client1 - client0,
            )
            if path.admin_ports:
                per_1000 = (sent1 - sent0) * 1000 / result.messages
                control.append(per_1000)
                print(f"  {'':<22} {label:<8} control messages: {per_1000:.1f} per 1,000")


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def print_split(
    results: list[tuple[Result, list[float]]],
    splits: list[list[tuple[float, ...]]],
    idle: dict[str, float],
) -> None:
    """Where the cluster's CPU goes: each member's share per message, and
    what is left of each path's CPU per message once its idle rate (CPU a
    second with no client, measured at the start) is taken out."""
    print()
    print(
        f"idle CPU, ms a second: one gateway {idle['single']:.1f}, cluster member the "
        f"clients use {idle['member']:.1f}, owner {idle['owner']:.1f}"
    )
    print(
        f"{'workload':<22} {'member µs':>9} {'owner µs':>9}  "
        f"{'single-idle':>11} {'clust-idle':>10} {'x':>5}"
    )
    for (result, _control), split in zip(results, splits, strict=True):
        if not split:
            continue
        n = result.messages
        member = statistics.median(row[1] for row in split) * 1e6 / n
        owner = statistics.median(row[2] for row in split) * 1e6 / n
        seconds = statistics.median(row[0] for row in split)
        single_us = result.median(result.gateway_us, SINGLE) or 0.0
        single_busy = single_us - idle["single"] * seconds * 1e3 / n
        cluster_busy = member + owner - (idle["member"] + idle["owner"]) * seconds * 1e3 / n
        ratio = f"{cluster_busy / single_busy:.2f}" if single_busy > 0 else "-"
        print(
            f"{result.name:<22} {member:>9.1f} {owner:>9.1f}  "
            f"{single_busy:>11.1f} {cluster_busy:>10.1f} {ratio:>5}"
        )


def print_summary(results: list[tuple[Result, list[float]]]) -> bool:
    print()
    print("medians of the rounds")
    print(
        f"{'workload':<22} {'direct/s':>9} {'single/s':>9} {'cluster/s':>9} "
        f"{'single÷d':>8} {'clust÷d':>8}  {'single µs':>9} {'clust µs':>9} {'CPU x':>6}  "
        f"{'ctl/1000':>8}"
    )
    ok = True
    for result, control in results:
        single_ratio, cluster_ratio = result.ratio(SINGLE), result.ratio(CLUSTER)
        single_us = result.median(result.gateway_us, SINGLE)
        cluster_us = result.median(result.gateway_us, CLUSTER)
        cpu_ratio = cluster_us / single_us if cluster_us and single_us else None
        marks = []
        if not result.latency_only and cluster_ratio < RATIO_TARGET:
            marks.append(f"cluster÷direct < {RATIO_TARGET}")
        if cpu_ratio is not None and cpu_ratio > 1 + CPU_TARGET:
            marks.append(f"CPU > +{CPU_TARGET:.0%}")
        ok = ok and not marks
        control_median = _median(control)
        print(
            f"{result.name:<22} {result.rate(DIRECT):>9,.0f} {result.rate(SINGLE):>9,.0f} "
            f"{result.rate(CLUSTER):>9,.0f} {single_ratio:>8.2f} {cluster_ratio:>8.2f}  "
            f"{single_us or 0:>9.1f} {cluster_us or 0:>9.1f} "
            f"{'-' if cpu_ratio is None else f'{cpu_ratio:.2f}':>6}  "
            f"{'-' if control_median is None else f'{control_median:.1f}':>8}"
            + ("  " + "; ".join(marks) if marks else "")
        )
    return ok


def _forget_cluster(url: str, name: str) -> None:
    """Delete the cluster's owner and epochs queues and exchange (durable: kept across restarts)."""
    import pika

    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = connection.channel()
            channel.queue_delete(f"rabbitflow.cluster.{name}.owner")
            channel.queue_delete(f"rabbitflow.cluster.{name}.epochs")
            channel.exchange_delete(f"rabbitflow.cluster.{name}")
        finally:
            connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="per workload (50000)")
    parser.add_argument(
        "--latency-messages", type=int, default=None, help="window-1 run (messages / 10)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per workload (5)")
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"),
    )
    parser.add_argument("--cluster-batch", type=int, default=100, help="members' --cluster-batch")
    parser.add_argument(
        "--workload",
        action="append",
        metavar="NAME",
        help=f"run only this workload (repeatable; default: all of {list(WORKLOADS)})",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    unknown = sorted(set(args.workload or ()) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown --workload {unknown}; choose from {list(WORKLOADS)}")
    n = args.messages
    latency_n = args.latency_messages or max(1000, n // 10)
    parts = urlsplit(args.url)
    broker = broker_pid(
        args.management_url, unquote(parts.username or "guest"), unquote(parts.password or "guest")
    )
    name = f"rf-bench-{uuid.uuid4().hex[:8]}"
    cluster_args = ["--cluster", name, "--cluster-batch", str(args.cluster_batch)]

    with contextlib.ExitStack() as stack:
        single = stack.enter_context(GatewayProcess(args.url, args.management_url))
        stack.callback(_forget_cluster, args.url, name)  # after the members have stopped
        members = [
            stack.enter_context(
                GatewayProcess(args.url, args.management_url, extra_args=cluster_args)
            )
            for _ in range(2)
        ]
        owner = wait_for_cluster(members)
        # Clients go through the member that does not own the accounting.
        entry = next(m for m in members if cluster_view(m.admin_port)["member"] != owner)
        paths = {
            DIRECT: Target(args.url, [], []),
            SINGLE: Target(single.url, [single.pid], []),
            CLUSTER: Target(
                entry.url,
                [entry.pid, *(m.pid for m in members if m is not entry)],
                [m.admin_port for m in members],
            ),
        }
        cluster_path = paths[CLUSTER]
        idle0, idle_t0 = cluster_path.control_sent(), time.monotonic()
        cpu0 = [*paths[SINGLE].cpu_each(), *cluster_path.cpu_each()]
        time.sleep(IDLE_S)
        cpu1 = [*paths[SINGLE].cpu_each(), *cluster_path.cpu_each()]
        idle_s = time.monotonic() - idle_t0
        idle = (cluster_path.control_sent() - idle0) / idle_s
        idle_cpu = {
            label: (b - a) * 1e3 / idle_s
            for label, a, b in zip(("single", "member", "owner"), cpu0, cpu1, strict=True)
        }
        print(
            f"standalone gateway pid {single.pid}; cluster {name!r}: members "
            f"{[m.pid for m in members]} (clients on pid {entry.pid}, the other owns), batch "
            f"{args.cluster_batch}; idle control traffic {idle:.1f} messages/s (heartbeats)"
        )
        print(
            f"RabbitMQ beam.smp pid {broker}; {n:,} messages per workload, {args.rounds} rounds, "
            f"median kept; load average at the start: {load_average()}"
        )

        workloads = standard_workloads(args.url, n, latency_n)
        if args.workload:
            workloads = [(r, w) for r, w in workloads if r.name in args.workload]
        results: list[tuple[Result, list[float]]] = []
        splits: list[list[tuple[float, ...]]] = []
        for result, workload in workloads:
            control: list[float] = []
            split: list[tuple[float, ...]] = []
            thresholds = {
                "qpid.flow_stop_count": 4 * result.messages,
                "qpid.flow_resume_count": 2 * result.messages,
            }
            run_workload(
                result,
                workload,
                paths,
                direct=args.url,
                broker=broker,
                rounds=args.rounds,
                thresholds=thresholds,
                control=control,
                split=split,
            )
            results.append((result, control))
            splits.append(split)

    print(f"load average at the end: {load_average()}")
    ok = print_summary(results)
    print_split(results, splits, idle_cpu)
    print()
    print(
        f"targets for the cluster: through÷direct >= {RATIO_TARGET} (throughput workloads) and "
        f"CPU per message within {CPU_TARGET:.0%} of the standalone gateway: "
        + ("met" if ok else "NOT met")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
