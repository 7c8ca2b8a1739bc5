"""Shared helpers for the benchmarks in ``bench/``.

Every benchmark measures rabbitflow against a baseline run side by side in
the same process and prints ratios; absolute figures depend on the machine.

API:

``payload(size) -> bytes``
    A deterministic body of ``size`` bytes.
``scratch_queue(url, prefix, *, arguments=None, durable=True) -> ContextManager[str]``
    Declares a fresh queue (durable, or transient with ``durable=False``)
    with a unique name, yields the name and deletes the queue afterwards
    (even when the body raised).
``queue_depth(url, name) -> int``
    Ready messages in a queue (passive declare).
``Timing``
    One measured run: ``label``, ``size``, ``messages``, ``seconds`` and
    ``rate`` (messages per second).
``print_header()``, ``print_row(timing)``, ``print_table(timings)``
    A fixed-width table of timings, row by row (flushed) or at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika

__all__ = [
    "DEFAULT_URL",
    "NO_FLOW",
    "Timing",
    "load_average",
    "payload",
    "print_header",
    "print_row",
    "print_table",
    "queue_depth",
    "scratch_queue",
]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

#: Queue arguments that keep the gateway's flow control from ever engaging
#: (RabbitMQ ignores them): benches that measure the relay, not the flow.
NO_FLOW = {"qpid.flow_stop_count": 0, "qpid.flow_stop_size": 0}


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def payload(size: int) -> bytes:
    """Return a deterministic body of ``size`` bytes.

    Raises:
        ValueError: ``size`` is negative.
    """
    if size < 0:
        raise ValueError(f"payload size must be >= 0, got {size}")
    pattern = b"rabbitflow-bench-"
    return (pattern * (size // len(pattern) + 1))[:size]


@contextmanager
def scratch_queue(
    url: str, prefix: str, *, arguments: Mapping[str, Any] | None = None, durable: bool = True
) -> Iterator[str]:
    """Declare a fresh queue (durable unless told), yield its name, delete it afterwards.

    Raises:
        pika.exceptions.AMQPError: the broker refused the declare.
    """
    name = f"rf-bench-{prefix}-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_declare(name, durable=durable, arguments=dict(arguments or {}))
    finally:
        connection.close()
    try:
        yield name
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            connection.channel().queue_delete(name)
        finally:
            connection.close()


def queue_depth(url: str, name: str) -> int:
    """Return the number of ready messages in queue ``name``.

    Raises:
        pika.exceptions.ChannelClosedByBroker: the queue does not exist.
    """
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        frame = connection.channel().queue_declare(name, passive=True)
        return int(frame.method.message_count)
    finally:
        connection.close()


@dataclass(frozen=True)
class Timing:
    """One measured run of ``messages`` messages of ``size`` bytes."""

    label: str
    size: int
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        """Messages per second (infinite when nothing measurable elapsed)."""
        return self.messages / self.seconds if self.seconds > 0 else float("inf")


def print_header() -> None:
    """Print the column heads of :func:`print_row`."""
    print(f"{'run':<40} {'size':>6} {'messages':>9} {'seconds':>9} {'msgs/s':>10}", flush=True)


def print_row(t: Timing) -> None:
    """Print one timing: label, size, messages, seconds, msgs/s (flushed at once)."""
    print(
        f"{t.label:<40} {t.size:>6} {t.messages:>9} {t.seconds:>9.2f} {t.rate:>10.0f}",
        flush=True,
    )


def print_table(timings: Iterable[Timing]) -> None:
    """Print a header and one line per timing."""
    print_header()
    for t in timings:
        print_row(t)
