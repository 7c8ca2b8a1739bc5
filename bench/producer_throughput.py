"""Producer throughput: rabbitflow send() against raw pika, side by side.

Two workloads, each run for every message size:

* ``fast``: non-persistent messages to a transient (non-durable) queue,
  where RabbitMQ's disk is out of the way and the client's own cost shows;
* ``persistent``: persistent messages to a durable queue (the SDK's default
  delivery mode), where RabbitMQ's disk is the usual bottleneck.

Runs (each in its own process, on its own fresh queue, deleted afterwards):

(a) rabbitflow ``MessageProducer.send()``, capacity 100 (publisher confirms,
    always on); the clock stops once every send is confirmed;
(b) raw pika ``BlockingConnection`` with ``confirm_delivery()``: each
    ``basic_publish`` waits for its own confirm (persistent workload only);
(c) raw pika ``SelectConnection`` keeping a window of 100 unconfirmed
    publishes; the clock stops at the last confirm;
(t) 8 threads sharing one rabbitflow ``Connection``, each with its own
    session and producer (capacity 100), the messages split between them;
    the clock stops when the last thread's sends are confirmed.  Afterwards
    the queue is read back: every message exactly once, each thread's in
    order (fast workload only).

A round runs every selected run once per size; rounds alternate the order of
the runs (abct, tcba, ...).  Each ratio is computed per round and the median
over the rounds is printed (targets: fast a/c >= 0.95, t/c >= 0.9;
persistent a/c >= 0.9, a/b >= 3).

Run: ``flock /tmp/rabbitflow-bench.lock .venv/bin/python bench/producer_throughput.py``
(defaults: 50,000 messages per run, 5,000 for (b), 3 rounds, sizes 256 and
4096, both workloads).  ``RABBITMQ_URL`` or ``--url`` picks the broker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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


THREADS = 8


def _thread_body(thread: int, seq: int, size: int) -> bytes:
    head = f"{thread}:{seq}:".encode()
    return head + payload(max(size - len(head), 0))


def run_rabbitflow_threads(
    url: str, queue: str, body: bytes, messages: int, persistent: bool
) -> float:
    """8 threads, one shared Connection, a session and producer (capacity 100)
    each; seconds until every thread's sends are confirmed.  Bodies carry
    ``thread:seq:`` for the exactly-once / order check.

    Raises:
        BenchError: a thread failed.
    """
    import rabbitflow

    mode = rabbitflow.PERSISTENT if persistent else rabbitflow.NON_PERSISTENT
    per_thread = messages // THREADS
    errors: list[BaseException] = []
    with rabbitflow.ConnectionFactory(url).create_connection() as connection:
        pairs = []
        for _ in range(THREADS):
            session = connection.create_session()
            pairs.append((session, session.create_producer(session.create_queue(queue))))
        bodies = [
            [_thread_body(t, n, len(body)) for n in range(per_thread)] for t in range(THREADS)
        ]
        start_gate = threading.Barrier(THREADS + 1)

        def work(t: int) -> None:
            session, producer = pairs[t]
            start_gate.wait()
            try:
                for data in bodies[t]:
                    producer.send(session.create_bytes_message(data), delivery_mode=mode)
                producer.close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        start_gate.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    if errors:
        raise BenchError(f"{len(errors)} thread(s) failed: {errors[0]!r}")
    return elapsed


def check_threads(url: str, queue: str, messages: int) -> None:
    """Read ``queue`` back: each thread's messages exactly once and in order.

    Raises:
        BenchError: a message is missing, duplicated or out of order.
    """
    per_thread = messages // THREADS
    seen: dict[int, list[int]] = {t: [] for t in range(THREADS)}
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        deliveries = channel.consume(queue, auto_ack=True, inactivity_timeout=5)
        for total, (_method, _props, body) in enumerate(deliveries, start=1):
            if body is None:
                break
            thread, seq, _ = body.split(b":", 2)
            seen[int(thread)].append(int(seq))
            if total == per_thread * THREADS:
                break
        channel.cancel()
    finally:
        connection.close()
    for thread, seqs in seen.items():
        if seqs != list(range(per_thread)):
            raise BenchError(
                f"thread {thread}: {len(seqs)} messages, not 0..{per_thread - 1} exactly once "
                "in order"
            )


Runner = Callable[[str, str, bytes, int, bool], float]
RUNS: dict[str, tuple[str, Runner]] = {
    "a": ("(a) rabbitflow send(), capacity 100", run_rabbitflow),
    "b": ("(b) pika Blocking, confirm per message", run_pika_blocking),
    "c": ("(c) pika Select, window 100", run_pika_select),
    "t": (f"(t) rabbitflow, {THREADS} threads, 1 conn", run_rabbitflow_threads),
    # (a) with the SDK of another source tree (--baseline-src), for before/after.
    "A": ("(A) rabbitflow send(), baseline tree", run_rabbitflow),
}
WORKLOADS = {"fast": "act", "persistent": "abc"}
TARGETS = {
    "fast": [("a", "c", 0.95), ("t", "c", 0.9)],
    "persistent": [("a", "c", 0.9), ("a", "b", 3.0)],
}


def _child(argv: list[str]) -> int:
    """Run one publisher in this process and print its seconds as JSON."""
    key, url, queue, size, messages, persistent = argv
    _, run = RUNS[key]
    body = payload(int(size))
    cpu_before = time.process_time()
    seconds = run(url, queue, body, int(messages), persistent == "1")
    cpu = time.process_time() - cpu_before
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu}))
    return 0


@dataclass(frozen=True)
class CpuTiming(Timing):
    """A timing with the CPU time of the publishing process (every thread:
    the application's and the client's I/O thread)."""

    cpu_seconds: float = 0.0

    @property
    def cpu_us_per_message(self) -> float:
        """CPU microseconds per message."""
        return self.cpu_seconds / self.messages * 1e6


def run_in_process(
    key: str,
    url: str,
    queue: str,
    size: int,
    messages: int,
    *,
    persistent: bool,
    sdk_src: str | None = None,
) -> tuple[float, float]:
    """Run publisher ``key`` in a fresh Python process; its seconds and CPU seconds.  With
    ``sdk_src`` the process imports ``rabbitflow`` from ``<sdk_src>/client``.

    Raises:
        BenchError: the process failed.
    """
    env = dict(os.environ)
    if sdk_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(sdk_src) / "client"), *filter(None, [env.get("PYTHONPATH")])]
        )
    result = subprocess.run(
        [sys.executable, __file__, "--child", key, url, queue, str(size), str(messages),
         "1" if persistent else "0"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env=env,
    )  # fmt: skip
    if result.returncode != 0:
        raise BenchError(f"run {key} failed: {result.stderr.strip()[-2000:]}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    return float(answer["seconds"]), float(answer["cpu_seconds"])


def measure_once(
    url: str, workload: str, key: str, size: int, messages: int, *, baseline: str | None = None
) -> CpuTiming:
    """One run of ``key`` on its own fresh queue.

    Raises:
        BenchError: the queue does not hold exactly what was sent (or, for the
            threaded run, not each thread's messages once and in order).
    """
    label, _ = RUNS[key]
    persistent = workload == "persistent"
    if key == "t":
        messages -= messages % THREADS
    with scratch_queue(url, f"{key}-{size}", durable=persistent) as queue:
        seconds, cpu = run_in_process(
            key,
            url,
            queue,
            size,
            messages,
            persistent=persistent,
            sdk_src=baseline if key == "A" else None,
        )
        depth = queue_depth(url, queue)
        if depth != messages:
            raise BenchError(f"{label}: queue holds {depth} messages, expected {messages}")
        if key == "t":
            check_threads(url, queue, messages)
    return CpuTiming(label, size, messages, seconds, cpu)


def _print_row(t: CpuTiming) -> None:
    print_row(t)
    print(f"{'':<40} {'':>6} {'':>9} {'cpu us/msg':>9} {t.cpu_us_per_message:>10.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the table and ratios; 0 on success."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("RABBITMQ_URL", DEFAULT_URL))
    parser.add_argument("--messages", type=int, default=50_000, help="per run (default 50000)")
    parser.add_argument(
        "--blocking-messages", type=int, default=5_000, help="for run (b) (default 5000)"
    )
    parser.add_argument(
        "--sizes", default="256,4096", help="comma-separated body sizes in bytes (256,4096)"
    )
    parser.add_argument(
        "--workloads", default="fast,persistent", help="fast and/or persistent (default both)"
    )
    parser.add_argument("--runs", default="abct", help="which runs: any of a, b, c, t")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument(
        "--baseline-src",
        help="a source tree (e.g. a git worktree of an older commit): adds run (A), the "
        "SDK of that tree, beside (a) in every round, and the ratio A/c",
    )
    args = parser.parse_args(argv)
    if args.messages <= 0 or args.rounds <= 0 or args.blocking_messages <= 0:
        parser.error("--messages, --blocking-messages and --rounds must be positive")
    if not args.runs or set(args.runs) - set("abct"):
        parser.error("--runs takes letters from 'abct'")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - set(WORKLOADS):
        parser.error("--workloads takes fast and/or persistent")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    print(f"producer throughput, broker {args.url.split('@')[-1]}, {args.rounds} rounds")
    print(
        f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
    summary: list[str] = []
    for workload in workloads:
        keys = [k for k in WORKLOADS[workload] if k in args.runs]
        if args.baseline_src:
            keys.insert(1, "A")
        print(f"\n== {workload}: {args.messages} messages per run ({args.blocking_messages} for b)")
        print_header()
        for size in sizes:
            rounds: list[dict[str, CpuTiming]] = []
            for r in range(args.rounds):
                order = keys if r % 2 == 0 else list(reversed(keys))
                timings: dict[str, CpuTiming] = {}
                for key in order:
                    count = args.blocking_messages if key == "b" else args.messages
                    timings[key] = measure_once(
                        args.url, workload, key, size, count, baseline=args.baseline_src
                    )
                    _print_row(timings[key])
                rounds.append(timings)
            targets = TARGETS[workload] + ([("A", "c", 0.0)] if args.baseline_src else [])
            for num, den, target in targets:
                if num not in keys or den not in keys:
                    continue
                ratios = [t[num].rate / t[den].rate for t in rounds]
                median = statistics.median(ratios)
                per_round = " / ".join(f"{x:.2f}" for x in ratios)
                summary.append(
                    f"{workload:<11} {size:>5} B  {num}/{den} median {median:.2f} "
                    + (
                        f"(rounds {per_round}; target >= {target:g}) "
                        f"{'OK' if median >= target else 'BELOW TARGET'}"
                        if target
                        else f"(rounds {per_round}; baseline tree)"
                    )
                )
            for key in keys:
                cpus = [t[key].cpu_us_per_message for t in rounds]
                summary.append(
                    f"{workload:<11} {size:>5} B  {key} CPU median {statistics.median(cpus):.1f} "
                    f"us/msg (rounds {' / '.join(f'{x:.1f}' for x in cpus)})"
                )
    print()
    for line in summary:
        print(line)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
