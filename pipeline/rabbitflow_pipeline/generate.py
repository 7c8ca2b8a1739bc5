"""Realistic gateway event logs (and client logs) at scale, for benchmarks and demos.

    python -m rabbitflow_pipeline.generate --events 5000000 --queues 300 --days 3 --out DIR

Writes ``gateway-<g>.jsonl`` per simulated gateway (and ``client-<g>.jsonl``
for the producers that log JSON).  Every gateway file is in time order, as a
gateway writes it; across files the events interleave.  Per queue, episodes
never overlap: QUE-1003, the CHN-1005 of each producer channel blocked on it,
QUE-1004, then CHN-1006 (or CHN-1012 when a producer ignored flow); now and
then a gateway restart re-announces QUE-1003 inside an episode.  Per vhost,
store episodes block their own producers (``** All Queues **``).  The last
episode of a queue may be left open.  The lines are exactly what
:meth:`rabbitflow_broker.events.Event.to_record` renders, formatted directly
(the dataclasses would cost ~10x more per line).
"""

# The line formatters take positional arguments on purpose: they run millions
# of times and mirror the event fields in order.
# ruff: noqa: PLR0917

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GatewayPlan", "generate", "main"]

ALL_QUEUES = "** All Queues **"
START_MS = 1_795_000_000_000  # 2026-11-18T11:06:40Z: a fixed start keeps runs reproducible

_STOPS = (500, 1000, 2000, 5000, 10000)
_SECOND_CACHE: dict[int, str] = {}


def _ts(ms: int) -> str:
    second, milli = divmod(ms, 1000)
    prefix = _SECOND_CACHE.get(second)
    if prefix is None:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        if len(_SECOND_CACHE) > 100_000:
            _SECOND_CACHE.clear()
        _SECOND_CACHE[second] = prefix
    return f"{prefix}.{milli:03d}Z"


def _q(s: str) -> str:
    return json.dumps(s)


def _vpath(vhost: str) -> str:
    return vhost if vhost.startswith("/") else "/" + vhost


@dataclass(frozen=True)
class GatewayPlan:
    """What one worker writes: one gateway's queues, vhosts and event budget."""

    gateway: int
    queues: tuple[tuple[str, str, int], ...]  # (vhost, name, events quota)
    vhosts: tuple[str, ...]
    store_events: int
    start_ms: int
    span_ms: int
    seed: int
    client_fraction: float
    out: str


@dataclass(frozen=True)
class _Producer:
    connection: int
    channel: int
    remote_host: str
    remote_port: int
    name: str
    capacity: int
    logs: bool


def _over(ts: int, vhost: str, queue: str, size: int, cap: int, msgs: int, mcap: int) -> str:
    return (
        f'{{"ts": "{_ts(ts)}", "code": "QUE-1003", '
        f'"subject": {_q(f"[vh({_vpath(vhost)})/qu({queue})]")}, '
        f'"message": "Overfull : Size : {size:,} bytes, Capacity : {cap:,}, Messages : {msgs:,}, '
        f'Message Capacity : {mcap:,}", "vhost": {_q(vhost)}, "queue": {_q(queue)}, '
        f'"size": {size}, "capacity": {cap}, "messages": {msgs}, "message_capacity": {mcap}}}'
    )


def _under(ts: int, vhost: str, queue: str, size: int, rcap: int, msgs: int, mcap: int) -> str:
    return (
        f'{{"ts": "{_ts(ts)}", "code": "QUE-1004", '
        f'"subject": {_q(f"[vh({_vpath(vhost)})/qu({queue})]")}, '
        f'"message": "Underfull : Size : {size:,} bytes, Resume Capacity : {rcap:,}, '
        f'Messages : {msgs:,}, Message Capacity : {mcap:,}", "vhost": {_q(vhost)}, '
        f'"queue": {_q(queue)}, "size": {size}, "resume_capacity": {rcap}, "messages": {msgs}, '
        f'"message_capacity": {mcap}}}'
    )


def _channel(ts: int, code: str, message: str, vhost: str, p: _Producer, queue: str | None) -> str:
    subject = (
        f"[con:{p.connection}(guest@{p.remote_host}:{p.remote_port}{_vpath(vhost)})/ch:{p.channel}]"
    )
    tail = f', "queue": {_q(queue)}' if queue is not None else ""
    return (
        f'{{"ts": "{_ts(ts)}", "code": "{code}", "subject": {_q(subject)}, '
        f'"message": {_q(message)}, "vhost": {_q(vhost)}, "connection": {p.connection}, '
        f'"user": "guest", "remote_host": "{p.remote_host}", "remote_port": {p.remote_port}, '
        f'"channel": {p.channel}{tail}}}'
    )


def _store(ts: int, code: str, message: str, vhost: str, size: int, over: int, under: int) -> str:
    return (
        f'{{"ts": "{_ts(ts)}", "code": "{code}", '
        f'"subject": {_q(f"[vh({_vpath(vhost)})/ms(RabbitMQ)]")}, '
        f'"message": "{message}", "vhost": {_q(vhost)}, "store": "RabbitMQ", "size": {size}, '
        f'"overfull_size": {over}, "underfull_size": {under}}}'
    )


def _client(
    ts: int, level: str, text: str, flow_event: str, p: _Producer, queue: str, waited_ms: int | None
) -> str:
    waited = f', "waited_ms": {waited_ms}' if waited_ms is not None else ""
    return (
        f'{{"timestamp": "{_ts(ts)}", "level": "{level}", "logger": "rabbitflow.client", '
        f'"event": {_q(text)}, "flow_event": "{flow_event}"{waited}, "producer": "{p.name}", '
        f'"destination": {_q("queue://" + queue)}, "capacity": {p.capacity}}}'
    )


def _block_client_lines(p: _Producer, queue: str, t0: int, t1: int) -> list[tuple[int, str]]:
    lines = [
        (
            t0,
            _client(
                t0,
                "info",
                "Broker enforced flow control has been enforced",
                "flow_enforced",
                p,
                queue,
                None,
            ),
        )
    ]
    waited = 5000
    while t0 + waited < t1:
        if waited >= 60000:
            lines.append(
                (
                    t0 + waited,
                    _client(
                        t0 + waited,
                        "error",
                        "Message send failed due to timeout waiting on broker enforced flow"
                        " control",
                        "send_failed",
                        p,
                        queue,
                        waited,
                    ),
                )
            )
            break
        lines.append(
            (
                t0 + waited,
                _client(
                    t0 + waited,
                    "warning",
                    f"Message send delayed by {waited // 1000}s due to broker enforced"
                    " flow control",
                    "send_delayed",
                    p,
                    queue,
                    waited,
                ),
            )
        )
        waited += 5000
    lines.append(
        (
            t1,
            _client(
                t1,
                "info",
                "Broker enforced flow control is no longer in effect",
                "flow_removed",
                p,
                queue,
                None,
            ),
        )
    )
    return lines


def _queue_events(
    rng: random.Random,
    vhost: str,
    queue: str,
    quota: int,
    producers: list[_Producer],
    start_ms: int,
    span_ms: int,
    client: list[tuple[int, str]],
) -> Iterator[tuple[int, str]]:
    stop = rng.choice(_STOPS)
    resume = int(stop * rng.uniform(0.5, 0.8))
    msg_size = rng.choice((200, 1000, 4000, 16000))
    per_episode = 2 + 2 * len(producers)
    episodes = max(1, -(-quota // per_episode))
    slot = span_ms / episodes
    emitted = 0
    for index in range(episodes):
        if emitted >= quota:
            return
        t0 = int(start_ms + index * slot + rng.uniform(0, slot * 0.3))
        # Heavy tail: mostly seconds, sometimes minutes (bounded by the slot).
        duration = int(min(slot * 0.65, rng.lognormvariate(9.6, 1.0)))
        t1 = t0 + max(duration, 50)
        start_msgs = stop + 1 + rng.randrange(0, 20)
        end_msgs = max(0, resume - 1 - rng.randrange(0, 20))
        batch: list[tuple[int, str]] = [
            (t0, _over(t0, vhost, queue, start_msgs * msg_size, 0, start_msgs, stop))
        ]
        if rng.random() < 0.01:  # a gateway restart re-announces the state
            tr = t0 + (t1 - t0) // 2
            batch.append((tr, _over(tr, vhost, queue, start_msgs * msg_size, 0, start_msgs, stop)))
        batch.append((t1, _under(t1, vhost, queue, end_msgs * msg_size, 0, end_msgs, resume)))
        for p in producers:
            b0 = t0 + rng.randrange(0, 200)
            ignores = rng.random() < 0.02 and t1 - b0 > 5000
            b1 = b0 + 5000 if ignores else t1 + rng.randrange(1, 50)
            batch.append(
                (
                    b0,
                    _channel(
                        b0, "CHN-1005", f"Flow Control Enforced (Queue {queue})", vhost, p, queue
                    ),
                )
            )
            if ignores:
                batch.append(
                    (
                        b1,
                        _channel(
                            b1,
                            "CHN-1012",
                            "Flow Control Ignored. Channel will be closed.",
                            vhost,
                            p,
                            None,
                        ),
                    )
                )
            else:
                batch.append((b1, _channel(b1, "CHN-1006", "Flow Control Removed", vhost, p, None)))
            if p.logs:
                client.extend(_block_client_lines(p, queue, b0, b1))
        batch.sort(key=lambda item: item[0])
        for item in batch:
            if emitted >= quota:
                return
            emitted += 1
            yield item


def _store_events(
    rng: random.Random,
    vhost: str,
    quota: int,
    producers: list[_Producer],
    start_ms: int,
    span_ms: int,
) -> Iterator[tuple[int, str]]:
    per_episode = 2 + 2 * len(producers)
    episodes = max(1, -(-quota // per_episode))
    slot = span_ms / episodes
    over, under = 8 * 2**30, 6 * 2**30
    emitted = 0
    for index in range(episodes):
        t0 = int(start_ms + index * slot + rng.uniform(0, slot * 0.3))
        t1 = t0 + int(min(slot * 0.5, rng.uniform(10_000, 600_000)))
        batch = [
            (
                t0,
                _store(
                    t0,
                    "MST-1008",
                    "Store overfull, flow control will be enforced",
                    vhost,
                    over + rng.randrange(1, 2**20),
                    over,
                    under,
                ),
            ),
            (
                t1,
                _store(
                    t1,
                    "MST-1009",
                    "Store overfull condition cleared",
                    vhost,
                    under - rng.randrange(1, 2**20),
                    over,
                    under,
                ),
            ),
        ]
        for p in producers:
            batch.append(
                (
                    t0 + 1,
                    _channel(
                        t0 + 1,
                        "CHN-1005",
                        f"Flow Control Enforced (Queue {ALL_QUEUES})",
                        vhost,
                        p,
                        ALL_QUEUES,
                    ),
                )
            )
            batch.append(
                (t1 + 1, _channel(t1 + 1, "CHN-1006", "Flow Control Removed", vhost, p, None))
            )
        batch.sort(key=lambda item: item[0])
        for item in batch:
            if emitted >= quota:
                return
            emitted += 1
            yield item


def _write_gateway(plan: GatewayPlan) -> tuple[str, int, int]:
    rng = random.Random(plan.seed * 1000 + plan.gateway)
    client: list[tuple[int, str]] = []
    connection = 0
    streams: list[Iterator[tuple[int, str]]] = []

    def producers_for(count: int, logs: bool) -> list[_Producer]:
        nonlocal connection
        made = []
        for _ in range(count):
            connection += 1
            made.append(
                _Producer(
                    connection=connection,
                    channel=1,
                    remote_host=f"10.{plan.gateway}.{connection % 250}.7",
                    remote_port=30000 + connection % 30000,
                    name=f"gw{plan.gateway}-p{connection}",
                    capacity=rng.choice((50, 100, 100, 200, 500)),
                    logs=logs,
                )
            )
        return made

    for vhost, name, quota in plan.queues:
        count = rng.choices((1, 2, 3, 4), weights=(30, 35, 20, 15))[0]
        logs = rng.random() < plan.client_fraction
        streams.append(
            _queue_events(
                rng,
                vhost,
                name,
                quota,
                producers_for(count, logs),
                plan.start_ms,
                plan.span_ms,
                client,
            )
        )
    for index, vhost in enumerate(plan.vhosts):
        share = plan.store_events // len(plan.vhosts) + (
            1 if index < plan.store_events % len(plan.vhosts) else 0
        )
        if share:
            streams.append(
                _store_events(
                    rng, vhost, share, producers_for(2, False), plan.start_ms, plan.span_ms
                )
            )
    path = Path(plan.out) / f"gateway-{plan.gateway}.jsonl"
    written = 0
    with path.open("w", encoding="utf-8", buffering=1 << 20) as fh:
        buffer: list[str] = []
        for _, text in heapq.merge(*streams, key=lambda item: item[0]):
            buffer.append(text)
            if len(buffer) >= 10_000:
                fh.write("\n".join(buffer))
                fh.write("\n")
                written += len(buffer)
                buffer.clear()
        if buffer:
            fh.write("\n".join(buffer))
            fh.write("\n")
            written += len(buffer)
    if client:
        client.sort(key=lambda item: item[0])
        client_path = Path(plan.out) / f"client-{plan.gateway}.jsonl"
        with client_path.open("w", encoding="utf-8", buffering=1 << 20) as fh:
            fh.write("\n".join(text for _, text in client))
            fh.write("\n")
    return str(path), written, len(client)


def generate(
    out: Path,
    *,
    events: int = 5_000_000,
    queues: int = 300,
    days: float = 3.0,
    gateways: int = 4,
    seed: int = 1,
    client_fraction: float = 0.05,
    processes: int = 2,
) -> list[Path]:
    """Write the logs under ``out``; returns the gateway log paths.

    Exactly ``events`` gateway events are written (client-log lines are
    extra).  Queue activity is skewed (a few hot queues, a long tail).

    Raises:
        ValueError: a non-positive count, or fewer queues than gateways.
    """
    if events <= 0 or queues <= 0 or days <= 0 or gateways <= 0 or processes <= 0:
        raise ValueError("events, queues, days, gateways and processes must be positive")
    if queues < gateways:
        raise ValueError(f"need at least one queue per gateway ({queues} < {gateways})")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    store_total = max(gateways * 4, events // 200)
    queue_total = events - store_total
    weights = [1.0 / (rank + 1) ** 0.7 for rank in range(queues)]
    rng.shuffle(weights)
    scale = queue_total / sum(weights)
    quotas = [int(w * scale) for w in weights]
    for index in range(queue_total - sum(quotas)):
        quotas[index % queues] += 1
    vhosts = {
        g: (("/", f"gw{g}-b") if g == 0 else (f"gw{g}-a", f"gw{g}-b")) for g in range(gateways)
    }
    per_gateway: dict[int, list[tuple[str, str, int]]] = {g: [] for g in range(gateways)}
    for index, quota in enumerate(quotas):
        g = index % gateways
        per_gateway[g].append((vhosts[g][index // gateways % 2], f"q{index:04d}", quota))
    store_share = [
        store_total // gateways + (1 if g < store_total % gateways else 0) for g in range(gateways)
    ]
    plans = [
        GatewayPlan(
            gateway=g,
            queues=tuple(per_gateway[g]),
            vhosts=vhosts[g],
            store_events=store_share[g],
            start_ms=START_MS,
            span_ms=int(days * 86_400_000),
            seed=seed,
            client_fraction=client_fraction,
            out=str(out),
        )
        for g in range(gateways)
    ]
    if processes == 1:
        results = [_write_gateway(plan) for plan in plans]
    else:
        with ProcessPoolExecutor(max_workers=processes) as pool:
            results = list(pool.map(_write_gateway, plans))
    return [Path(path) for path, _, _ in results]


def main(argv: list[str] | None = None) -> int:
    """Command line entry; prints what it wrote."""
    parser = argparse.ArgumentParser(
        prog="python -m rabbitflow_pipeline.generate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--queues", type=int, default=300)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--client-fraction",
        type=float,
        default=0.05,
        help="share of queues whose producers write a client log",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        paths = generate(
            args.out,
            events=args.events,
            queues=args.queues,
            days=args.days,
            gateways=args.gateways,
            seed=args.seed,
            client_fraction=args.client_fraction,
            processes=args.processes,
        )
    except ValueError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.events:,} events to {len(paths)} gateway logs under {args.out} "
        f"in {time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
