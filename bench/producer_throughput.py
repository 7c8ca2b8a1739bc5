"""Producer throughput: rabbitflow send() against raw pika, side by side.

For each message size, three runs publish the same number of messages to a
fresh durable queue each (deleted afterwards) on the same broker:

(a) rabbitflow ``MessageProducer.send()`` with capacity 100 (publisher
    confirms, always on); the clock stops once every send is confirmed;
(b) raw pika ``BlockingConnection`` with ``confirm_delivery()``: each
    ``basic_publish`` waits for its own confirm;
(c) raw pika ``SelectConnection`` keeping a window of 100 unconfirmed
    publishes; the clock stops at the last confirm.

It prints msgs/s for each and the ratios a/c (target >= 0.9) and a/b
(target >= 3).  All three publish persistent messages (rabbitflow's default
delivery mode) unless ``--transient`` is given.

Run: ``.venv/bin/python bench/producer_throughput.py [--messages N] [--rounds R]``
(the full run is 100,000 messages per size; ``--messages 2000`` is a quick
smoke run).  ``RABBITMQ_URL`` or ``--url`` picks the broker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pika
from pika.spec import Basic

if __package__ in (None, ""):
    # Run as a file (python bench/producer_throughput.py): make `bench` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    DEFAULT_URL,
    Timing,
    payload,
    print_header,
    print_row,
    queue_depth,
    scratch_queue,
)

CAPACITY = 100


class BenchError(RuntimeError):
    """A benchmark run failed (nack, lost confirm, wrong queue depth)."""


def _properties(persistent: bool) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2 if persistent else 1)


def run_rabbitflow(url: str, queue: str, body: bytes, messages: int, persistent: bool) -> float:
    """Publish with rabbitflow send() (capacity 100); seconds until all are confirmed.

    Raises:
        rabbitflow.JMSException: the SDK failed to send.
    """
    import rabbitflow

    mode = rabbitflow.PERSISTENT if persistent else rabbitflow.NON_PERSISTENT
    factory = rabbitflow.ConnectionFactory(url)
    with factory.create_connection() as connection:
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=CAPACITY)
        start = time.perf_counter()
        for _ in range(messages):
            producer.send(session.create_bytes_message(body), delivery_mode=mode)
        # close() returns once every send of this producer is confirmed.
        producer.close()
        elapsed = time.perf_counter() - start
        session.close()
    return elapsed


def run_pika_blocking(url: str, queue: str, body: bytes, messages: int, persistent: bool) -> float:
    """Publish with BlockingConnection, waiting for each confirm; seconds taken.

    Raises:
        pika.exceptions.NackError: the broker nacked a message.
    """
    properties = _properties(persistent)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        start = time.perf_counter()
        for _ in range(messages):
            channel.basic_publish("", queue, body, properties)
        return time.perf_counter() - start
    finally:
        connection.close()


def run_pika_select(
    url: str, queue: str, body: bytes, messages: int, persistent: bool, *, window: int = CAPACITY
) -> float:
    """Publish with SelectConnection, ``window`` unconfirmed at most; seconds to last confirm.

    Raises:
        BenchError: a nack, a connection failure or a missing confirm.
    """
    properties = _properties(persistent)
    state = {"sent": 0, "start": 0.0, "end": 0.0}
    pending: set[int] = set()
    errors: list[str] = []
    channel_box: list[pika.channel.Channel] = []

    def publish_more() -> None:
        channel = channel_box[0]
        while state["sent"] < messages and len(pending) < window:
            channel.basic_publish("", queue, body, properties)
            state["sent"] += 1
            pending.add(int(state["sent"]))

    def on_confirm(frame: pika.frame.Method) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            errors.append(f"nack for delivery tag {method.delivery_tag}")
            connection.close()
            return
        tag = method.delivery_tag
        if method.multiple:
            pending.difference_update([t for t in pending if t <= tag])
        else:
            pending.discard(tag)
        if state["sent"] == messages and not pending:
            state["end"] = time.perf_counter()
            connection.close()
            return
        publish_more()

    def on_confirm_selected(_frame: pika.frame.Method) -> None:
        state["start"] = time.perf_counter()
        publish_more()

    def on_channel(channel: pika.channel.Channel) -> None:
        channel_box.append(channel)
        channel.confirm_delivery(on_confirm, callback=on_confirm_selected)

    def on_open(conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_open_error(conn: pika.SelectConnection, exc: BaseException | str) -> None:
        errors.append(f"connection failed: {exc}")
        conn.ioloop.stop()

    def on_close(conn: pika.SelectConnection, _reason: BaseException) -> None:
        conn.ioloop.stop()

    connection = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=on_open,
        on_open_error_callback=on_open_error,
        on_close_callback=on_close,
    )
    connection.ioloop.start()
    if errors:
        raise BenchError("; ".join(errors))
    if not state["end"]:
        raise BenchError(f"connection closed with {len(pending)} confirms outstanding")
    return state["end"] - state["start"]


RUNS = {
    "a": ("(a) rabbitflow send(), capacity 100", run_rabbitflow),
    "b": ("(b) pika Blocking, confirm per message", run_pika_blocking),
    "c": ("(c) pika Select, window 100", run_pika_select),
}


def measure(url: str, size: int, messages: int, persistent: bool, runs: str) -> dict[str, Timing]:
    """Run each selected publisher once for ``size``-byte bodies on its own fresh queue.

    Raises:
        BenchError: a run did not leave exactly ``messages`` messages in its queue.
    """
    body = payload(size)
    timings: dict[str, Timing] = {}
    for key in runs:
        label, run = RUNS[key]
        with scratch_queue(url, f"{key}-{size}") as queue:
            seconds = run(url, queue, body, messages, persistent)
            depth = queue_depth(url, queue)
        if depth != messages:
            raise BenchError(f"{label}: queue holds {depth} messages, expected {messages}")
        timings[key] = Timing(label, size, messages, seconds)
    return timings


def _ratio(timings: dict[str, Timing], num: str, den: str) -> str:
    if num not in timings or den not in timings:
        return "n/a"
    return f"{timings[num].rate / timings[den].rate:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the table and ratios; 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument("--messages", type=int, default=100_000, help="per run (default 100000)")
    parser.add_argument(
        "--sizes", default="256,4096", help="comma-separated body sizes in bytes (256,4096)"
    )
    parser.add_argument("--runs", default="abc", help="which runs: any of a, b, c (default abc)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat everything; ratios use each run's best"
    )
    parser.add_argument("--transient", action="store_true", help="publish non-persistent messages")
    args = parser.parse_args(argv)
    if args.messages <= 0 or args.rounds <= 0:
        parser.error("--messages and --rounds must be positive")
    if not args.runs or set(args.runs) - set(RUNS):
        parser.error("--runs takes letters from 'abc'")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    persistent = not args.transient

    print(
        f"producer throughput: {args.messages} messages per run, "
        f"{'persistent' if persistent else 'transient'}, broker {args.url.split('@')[-1]}"
    )
    best: dict[int, dict[str, Timing]] = {size: {} for size in sizes}
    print_header()
    for _ in range(args.rounds):
        for size in sizes:
            for key, timing in measure(
                args.url, size, args.messages, persistent, args.runs
            ).items():
                print_row(timing)
                if key not in best[size] or timing.rate > best[size][key].rate:
                    best[size][key] = timing
    print()
    if args.rounds > 1:
        print(f"ratios from the best of {args.rounds} rounds of each run")
    results = [best[size] for size in sizes]
    print(f"{'size':>6} {'a/c (target >= 0.9)':>22} {'a/b (target >= 3)':>20}")
    for size, timings in zip(sizes, results, strict=True):
        print(f"{size:>6} {_ratio(timings, 'a', 'c'):>22} {_ratio(timings, 'a', 'b'):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
