"""Helpers for ``bench/gateway_overhead.py``: the gateway under test and raw-pika workloads.

API:

``GatewayProcess(upstream, management_url, *, profile=None, event_loop="auto", source=None,
extra_args=())``
    ``rabbitflow-broker`` as a subprocess on free ports (``.url``,
    ``.admin_url``, ``.pid``); a context manager that stops it with SIGINT.
    With ``profile=PATH`` it runs under cProfile and writes the stats there;
    with ``source=TREE`` it imports the gateway from another checkout
    (``TREE/broker_plugin``, ``TREE/client`` and ``TREE/pipeline`` first on
    its ``PYTHONPATH``), so two versions can be compared in one run;
    ``.imported_from`` is the ``rabbitflow_broker`` package it runs;
    ``extra_args`` are appended to its command line; ``.log`` is its output.
``process_cpu_seconds(pid) -> float``
    utime + stime of a process so far, from ``/proc/<pid>/stat``.
``broker_pid(management_url, user, password) -> int``
    The OS pid of the RabbitMQ node (its ``beam.smp``) behind a management API.
``publish_window(url, queue, body, messages, window)``
    SelectConnection with publisher confirms, at most ``window``
    unconfirmed; returns ``(seconds, latencies)`` where ``latencies`` are
    the publish-to-confirm times of every message.
``publish_no_confirms(url, queue, body, messages)``
    SelectConnection without confirms; the clock stops when a final
    confirmed marker publish (after ``confirm.select``) is confirmed, i.e.
    when the broker has taken every message.  Returns seconds.
``consume(url, queue, messages, prefetch)``
    basic.consume with ``prefetch``, one ack per delivery; returns seconds
    until ``messages`` deliveries.
``percentile(values, pct)``
    Nearest-rank percentile.
"""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pika
from pika.spec import Basic

from rabbitflow_broker.server.rabbitmq_node import free_port, wait_for_amqp

__all__ = [
    "BenchError",
    "GatewayProcess",
    "broker_pid",
    "consume",
    "percentile",
    "process_cpu_seconds",
    "publish_no_confirms",
    "publish_window",
]

_RUN_TIMEOUT_S = 600.0

_PROBE = (
    "import rabbitflow_broker as m; a = getattr(m, 'accel', None); "
    "print(m.__path__[0] + (f' ({a.status()})' if a else ''))"
)


class BenchError(RuntimeError):
    """A workload failed (nack, lost confirm, connection closed, timeout)."""


class GatewayProcess:
    """``rabbitflow-broker`` in a subprocess on free ports."""

    def __init__(
        self,
        upstream: str,
        management_url: str,
        *,
        profile: str | None = None,
        event_loop: str = "auto",
        source: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        command = [sys.executable]
        if profile is not None:
            command += ["-m", "cProfile", "-o", profile]
        command += [
            "-m",
            "rabbitflow_broker.cli",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
            "--upstream",
            upstream,
            "--management-url",
            management_url,
            "--log-format",
            "json",
            "--event-loop",
            event_loop,
            *extra_args,
        ]
        self._command = command
        self._env = dict(os.environ)
        if source is not None:
            tree = source.resolve()
            if not (tree / "broker_plugin" / "rabbitflow_broker").is_dir():
                raise BenchError(f"{tree} holds no broker_plugin/rabbitflow_broker")
            # PYTHONPATH comes before the editable install's finder (appended to
            # sys.meta_path), so these packages shadow the venv's own tree.
            roots = [str(tree / part) for part in ("broker_plugin", "client", "pipeline")]
            if self._env.get("PYTHONPATH"):
                roots.append(self._env["PYTHONPATH"])
            self._env["PYTHONPATH"] = os.pathsep.join(roots)
        self._process: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"rf-bench-gateway-{self.port}.log"
        self.imported_from = self._imported_from()

    def _imported_from(self) -> str:
        """The ``rabbitflow_broker`` package directory the subprocess will
        import, and whether its engine is compiled (trees that have the choice)."""
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=self._env,
            capture_output=True,
            text=True,
            check=True,
        )
        return probe.stdout.strip()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BenchError("gateway not started")
        return self._process.pid

    def __enter__(self) -> GatewayProcess:
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(
                self._command, stdout=log, stderr=subprocess.STDOUT, env=self._env
            )
        try:
            wait_for_amqp("127.0.0.1", self.port, 60)
        except Exception as exc:
            self.__exit__()
            tail = self.log.read_text(errors="replace")[-2000:]
            raise BenchError(f"gateway did not start: {exc}\n{tail}") from exc
        return self

    def __exit__(self, *_exc: object) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far, in seconds (all its threads).

    Raises:
        BenchError: the process is gone or ``/proc`` is unreadable.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        raise BenchError(f"cannot read /proc/{pid}/stat: {exc}") from exc
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def broker_pid(management_url: str, user: str, password: str) -> int:
    """The OS pid of the RabbitMQ node behind ``management_url`` (its ``beam.smp``).

    Raises:
        BenchError: the API gives no single local node, or that pid is not a beam.smp.
    """
    request = urllib.request.Request(management_url.rstrip("/") + "/api/nodes")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    # A node whose management plugin was just enabled lists itself without its
    # stats (``os_pid`` among them) until its first stats emission, a few seconds.
    deadline = time.monotonic() + 30.0
    while True:
        with urllib.request.urlopen(request, timeout=10) as response:
            nodes = [node for node in json.load(response) if node.get("running", True)]
        if all("os_pid" in node for node in nodes):
            break
        if time.monotonic() > deadline:
            raise BenchError("the management API gave no os_pid for RabbitMQ within 30 s")
        time.sleep(0.5)
    pids = [int(node["os_pid"]) for node in nodes]
    if len(pids) != 1:
        raise BenchError(f"expected one running RabbitMQ node, the API lists {len(pids)}")
    try:
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes()
    except OSError as exc:
        raise BenchError(f"RabbitMQ pid {pids[0]} is not on this machine: {exc}") from exc
    if b"beam.smp" not in cmdline:
        raise BenchError(f"RabbitMQ pid {pids[0]} is not a beam.smp process")
    return pids[0]


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


class _Run:
    """One SelectConnection run: open, a channel, then ``start(channel)``; stop on ``finish``."""

    def __init__(self, url: str, start: Callable[[Any], None]) -> None:
        self._start = start
        self.error: str | None = None
        self.connection: Any = pika.SelectConnection(
            pika.URLParameters(url),
            on_open_callback=lambda conn: conn.channel(on_open_callback=self._opened),
            on_open_error_callback=lambda _c, exc: self.fail(f"connect failed: {exc!r}"),
            on_close_callback=lambda conn, _exc: conn.ioloop.stop(),
        )
        self.connection.ioloop.call_later(_RUN_TIMEOUT_S, lambda: self.fail("timed out"))

    def _opened(self, channel: Any) -> None:
        channel.add_on_close_callback(self._channel_closed)
        self._start(channel)

    def _channel_closed(self, _channel: Any, reason: Exception) -> None:
        if self.error is None and not self.connection.is_closing:
            self.fail(f"channel closed: {reason!r}")

    def fail(self, text: str) -> None:
        if self.error is None:
            self.error = text
        self.finish()

    def finish(self) -> None:
        if self.connection.is_open:
            self.connection.close()
        elif self.connection.is_closed:
            self.connection.ioloop.stop()

    def run(self) -> None:
        self.connection.ioloop.start()
        # Release pika's wake-up sockets with the loop.
        self.connection.ioloop.close()
        if self.error is not None:
            raise BenchError(self.error)


def publish_window(
    url: str, queue: str, body: bytes, messages: int, window: int
) -> tuple[float, list[float]]:
    """Publish with confirms and a window; return (seconds, publish-to-confirm latencies).

    Raises:
        BenchError: a nack, a closed channel or a timeout.
    """
    sent_at: list[float] = [0.0] * (messages + 1)
    latencies: list[float] = []
    state = {"next": 1, "confirmed": 0, "t0": 0.0, "t1": 0.0}
    channel_ref: list[Any] = []

    def pump() -> None:
        channel = channel_ref[0]
        while state["next"] <= messages and state["next"] - 1 - state["confirmed"] < window:
            tag = int(state["next"])
            sent_at[tag] = time.perf_counter()
            channel.basic_publish("", queue, body)
            state["next"] += 1

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if not isinstance(method, Basic.Ack):
            run.fail(f"nack for delivery tag {method.delivery_tag}")
            return
        now = time.perf_counter()
        first = int(state["confirmed"]) + 1
        last = int(method.delivery_tag)
        if not method.multiple and method.delivery_tag != first:
            # Out-of-order single acks do not happen on one queue; treat as a bug.
            run.fail(f"ack {method.delivery_tag} while {first} unconfirmed")
            return
        for tag in range(first, last + 1):
            latencies.append(now - sent_at[tag])
        state["confirmed"] = last
        if last >= messages:
            state["t1"] = now
            run.finish()
        else:
            pump()

    def start(channel: Any) -> None:
        channel_ref.append(channel)

        def selected(_frame: Any) -> None:
            state["t0"] = time.perf_counter()
            pump()

        channel.confirm_delivery(on_confirm, callback=selected)

    run = _Run(url, start)
    run.run()
    return state["t1"] - state["t0"], latencies


def publish_no_confirms(url: str, queue: str, body: bytes, messages: int) -> float:
    """Publish without confirms; time until the broker has taken all of them.

    Raises:
        BenchError: a closed channel or a timeout.
    """
    chunk = 500
    state = {"sent": 0, "t0": 0.0, "t1": 0.0}
    channel_ref: list[Any] = []

    def pump() -> None:
        channel = channel_ref[0]
        stop = min(messages, int(state["sent"]) + chunk)
        while state["sent"] < stop:
            channel.basic_publish("", queue, body)
            state["sent"] += 1
        if state["sent"] < messages:
            # Yield to the loop so the socket is written while we go on.
            run.connection.ioloop.add_callback_threadsafe(pump)
        else:
            channel.confirm_delivery(on_marker_confirm, callback=lambda _f: publish_marker())

    def publish_marker() -> None:
        channel_ref[0].basic_publish("", queue, b"marker")

    def on_marker_confirm(frame: Any) -> None:
        if not isinstance(frame.method, Basic.Ack):
            run.fail("marker nacked")
            return
        state["t1"] = time.perf_counter()
        run.finish()

    def start(channel: Any) -> None:
        channel_ref.append(channel)
        state["t0"] = time.perf_counter()
        pump()

    run = _Run(url, start)
    run.run()
    return state["t1"] - state["t0"]


def consume(url: str, queue: str, messages: int, prefetch: int) -> float:
    """Consume ``messages`` with ``prefetch``, acking each; return seconds.

    Raises:
        BenchError: a closed channel or a timeout.
    """
    state = {"received": 0, "t0": 0.0, "t1": 0.0}

    def start(channel: Any) -> None:
        def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
            ch.basic_ack(method.delivery_tag)
            state["received"] += 1
            if state["received"] == messages:
                state["t1"] = time.perf_counter()
                run.finish()

        def qos_ok(_frame: Any) -> None:
            state["t0"] = time.perf_counter()
            channel.basic_consume(queue, on_message)

        channel.basic_qos(prefetch_count=prefetch, callback=qos_ok)

    run = _Run(url, start)
    run.run()
    return state["t1"] - state["t0"]
