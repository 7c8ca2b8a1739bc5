"""CPU the relay spends per message, in-process, without sockets or RabbitMQ.

    .venv/bin/python bench/relay_cpu.py [--messages 200000] [--profile FILE]

Feeds a connection :class:`~rabbitflow_broker.engine.connection.Engine` the exact
bytes a pika client and RabbitMQ exchange, in 64 KiB-ish chunks as a socket would
deliver them, and times the engine's work (frame splitting,
routing, depth tracking, confirm bookkeeping) for each workload:

* ``publish 256B``: Basic.Publish + header + 256-byte body, no confirms;
* ``publish+confirm 256B``: the same on a confirm channel, plus the
  upstream Basic.Ack for each (one per message, as RabbitMQ sends them
  under a window);
* ``deliver+ack 256B``: Basic.Deliver + header + body from upstream and
  the client's Basic.Ack;
* ``confirm 4KiB reads``: 4 KiB publishes on a confirm channel as a
  windowed pika publisher's socket delivers them here (reads of 20-34 KB cut
  at any byte, so most reads end inside a message), and RabbitMQ's
  ``multiple`` acks, 2-5 messages each, a few per read;
* ``confirm 256B reads``: the same with 256-byte bodies as a gateway on a
  2-core machine reads them from a window-100 publisher (``strace``: reads of
  0.9-3.6 KB, about 8 messages, most ending inside a message) and one
  ``multiple`` ack of 8-20 messages per upstream read.

Printed: microseconds per message for each.  Unlike ``gateway_overhead.py``
the figure does not depend on what else the machine runs (the other
processes only slow the clock, not the count of work), so it shows whether
a change to the hot path helps.  As a yardstick it also times
``bytes.join`` of the same chunks, the least a relay must do.
"""

from __future__ import annotations

import argparse
import cProfile
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.body import ContentBody

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import NO_FLOW
from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.engine.connection import Engine
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway

QUEUE = "bench"
CHUNK_MESSAGES = 200


def _frame(channel: int, value: Any) -> bytes:
    return pamqp_frame.marshal(value, channel)


def _content(channel: int, method: Any, body: bytes) -> bytes:
    header = pamqp_header.ContentHeader(
        0, len(body), commands.Basic.Properties(content_type="application/octet-stream")
    )
    return _frame(channel, method) + _frame(channel, header) + _frame(channel, ContentBody(body))


def _relay() -> tuple[Engine, Gateway]:
    gateway = Gateway(GatewayConfig(), sink=lambda event: None)
    gateway.routing.declare_queue("/", QUEUE, NO_FLOW)
    gateway.queue_declared("/", QUEUE, NO_FLOW)
    engine = Engine(gateway, number=1)
    engine.start(0.0)
    engine.upstream_connected(0.0)
    return engine, gateway


def _client(engine: Engine, data: bytes) -> None:
    engine.receive_client(data, 1.0)


def _upstream(engine: Engine, data: bytes) -> None:
    engine.receive_upstream(data, 1.0)


def _setup(engine: Engine, *, confirm: bool, consume: bool) -> None:
    _client(engine, PROTOCOL_HEADER)
    _upstream(engine, _frame(0, commands.Connection.Tune(frame_max=131072)))
    _client(engine, _frame(0, commands.Connection.TuneOk(frame_max=131072)))
    _upstream(engine, _frame(0, commands.Connection.OpenOk()))
    _client(engine, _frame(1, commands.Channel.Open()))
    if confirm:
        _client(engine, _frame(1, commands.Confirm.Select()))
    if consume:
        _client(engine, _frame(1, commands.Basic.Consume(queue=QUEUE, consumer_tag="ctag")))
        _upstream(engine, _frame(1, commands.Basic.ConsumeOk(consumer_tag="ctag")))


def _workload(name: str, messages: int) -> tuple[Callable[[], None], list[bytes]]:
    relay, _gateway = _relay()
    body = b"x" * 256
    chunks: list[tuple[bool, bytes]] = []
    if name == "publish 256B":
        _setup(relay, confirm=False, consume=False)
        one = _content(1, commands.Basic.Publish(exchange="", routing_key=QUEUE), body)
        for _ in range(messages // CHUNK_MESSAGES):
            chunks.append((True, one * CHUNK_MESSAGES))
    elif name == "publish+confirm 256B":
        _setup(relay, confirm=True, consume=False)
        one = _content(1, commands.Basic.Publish(exchange="", routing_key=QUEUE), body)
        tag = 0
        for _ in range(messages // CHUNK_MESSAGES):
            chunks.append((True, one * CHUNK_MESSAGES))
            acks = []
            for _ in range(CHUNK_MESSAGES):
                tag += 1
                acks.append(_frame(1, commands.Basic.Ack(delivery_tag=tag)))
            chunks.append((False, b"".join(acks)))
    elif name == "deliver+ack 256B":
        _setup(relay, confirm=False, consume=True)
        tag = 0
        for _ in range(messages // CHUNK_MESSAGES):
            deliveries, acks = [], []
            for _ in range(CHUNK_MESSAGES):
                tag += 1
                deliveries.append(
                    _content(
                        1,
                        commands.Basic.Deliver(
                            consumer_tag="ctag", delivery_tag=tag, exchange="", routing_key=QUEUE
                        ),
                        body,
                    )
                )
                acks.append(_frame(1, commands.Basic.Ack(delivery_tag=tag)))
            chunks.append((False, b"".join(deliveries)))
            chunks.append((True, b"".join(acks)))
    elif name == "confirm 4KiB reads":
        _setup(relay, confirm=True, consume=False)
        chunks.extend(_socket_reads(messages, 4096, (20_000, 34_000), (2, 5), ack_after=4))
    elif name == "confirm 256B reads":
        _setup(relay, confirm=True, consume=False)
        chunks.extend(
            _socket_reads(messages, 256, (900, 3_600), (8, 20), ack_after=20, acks_per_read=1)
        )
    else:
        raise ValueError(name)

    def run() -> None:
        for from_client, data in chunks:
            if from_client:
                _client(relay, data)
            else:
                _upstream(relay, data)

    return run, [data for _, data in chunks]


def _socket_reads(
    messages: int,
    size: int,
    read_bytes: tuple[int, int],
    ack_messages: tuple[int, int],
    *,
    ack_after: int,
    acks_per_read: int | None = None,
) -> list[tuple[bool, bytes]]:
    """Client reads of ``read_bytes`` cut at random bytes, each followed by
    the multiple acks (of ``ack_messages`` messages each, once ``ack_after``
    are unacknowledged; at most ``acks_per_read``) that RabbitMQ would have
    sent by then (a fixed seed: the same every run)."""
    rnd = random.Random(1)
    one = _content(1, commands.Basic.Publish(exchange="", routing_key=QUEUE), b"x" * size)
    stream = one * messages
    reads: list[tuple[bool, bytes]] = []
    pos = acked = 0
    while pos < len(stream):
        cut = min(len(stream), pos + rnd.randint(*read_bytes))
        reads.append((True, stream[pos:cut]))
        pos = cut
        sent = cut // len(one)
        acks: list[bytes] = []
        last = cut == len(stream)
        while (
            acked + ack_after <= sent and (acks_per_read is None or len(acks) < acks_per_read)
        ) or (last and acked < sent):
            acked = min(sent, acked + rnd.randint(*ack_messages))
            acks.append(_frame(1, commands.Basic.Ack(delivery_tag=acked, multiple=True)))
        if acks:
            reads.append((False, b"".join(acks)))
    return reads


WORKLOADS = (
    "publish 256B",
    "publish+confirm 256B",
    "deliver+ack 256B",
    "confirm 4KiB reads",
    "confirm 256B reads",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write cProfile stats of every workload to this file")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    print(f"{'workload':24} {'relay us/msg':>12} {'join us/msg':>12}")
    for name in WORKLOADS:
        best = float("inf")
        join_best = float("inf")
        for _ in range(args.rounds):
            run, chunks = _workload(name, args.messages)
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            run()
            if profiler is not None:
                profiler.disable()
            best = min(best, time.perf_counter() - started)
            started = time.perf_counter()
            for chunk in chunks:
                b"".join([chunk[: len(chunk) // 2], chunk[len(chunk) // 2 :]])
            join_best = min(join_best, time.perf_counter() - started)
        print(
            f"{name:24} {best / args.messages * 1e6:12.2f} {join_best / args.messages * 1e6:12.3f}"
        )
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
