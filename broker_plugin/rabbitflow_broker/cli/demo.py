"""``rabbitflow-demo``: the Qpid flow-control example, live.

A queue with ``qpid.flow_stop_count=100`` and ``qpid.flow_resume_count=50``;
two rabbitflow producers, A (capacity 50) and B (capacity 15), sending as
fast as they can; a slow consumer that starts once the queue is overfull.
The demo tells the story in phases that each fit on a screen: the queue
filling up, the first stop/resume cycle line by line (depth, events, the
producers' own log lines), then one line per further cycle.  It ends with
a summary: the peak depth against the bound 100 + 50 + 15 = 165, the
events seen, how long each producer waited, messages sent and received,
and an exactly-once / in-order check.

Without ``--gateway-url`` it finds RabbitMQ (``--rabbitmq-url``, default
``$RABBITMQ_URL``, else ``amqp://guest:guest@127.0.0.1:5672/%2F``), or
starts a throwaway node when none answers, and runs the gateway in-process
on free ports; events then come straight from the gateway.  With
``--gateway-url URL --admin-url URL`` it uses an already-running gateway
(docker-compose) and reports the flow transitions it observes through the
admin API (credentials: ``--admin-user``/``--admin-password``, or in the
URL; a refused login stops the demo with a message).  The queue is deleted
at the end.  Exit status 0 when every
check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pika

from rabbitflow_broker.cli.demo_output import (
    _ClientLogHandler,
    _DemoSink,
    _Narrator,
    _Printer,
    _quiet_structlog,
)
from rabbitflow_broker.cli.demo_workers import (
    ProducerStats,
    _consumer,
    _ConsumerState,
    _InProcessGateway,
    _producer,
    _with_credentials,
)
from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import without_password
from rabbitflow_broker.server.rabbitmq_node import (
    RabbitMQNode,
    amqp_handshake_ok,
    host_port,
    rabbitmq_available,
)

__all__ = ["AdminRefused", "DemoOptions", "DemoResult", "main", "producer_label", "run"]

STOP, RESUME = 100, 50
CAPACITIES = {"A": 50, "B": 15}
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
#: Longest the whole demo may run before it gives up and reports what it saw.
DEADLINE_S = 120.0


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """What to run against and how much."""

    messages: int = 500
    consume_rate: float = 100.0
    gateway_url: str | None = None
    admin_url: str | None = None
    rabbitmq_url: str | None = None
    management_url: str | None = None
    admin_user: str | None = None
    admin_password: str | None = None
    interval: float = 0.5


@dataclass
class DemoResult:
    """What the demo observed; :attr:`ok` when every check holds."""

    queue: str
    bound: int
    peak: int = 0
    events: Counter[str] = field(default_factory=Counter)
    producers: list[ProducerStats] = field(default_factory=list)
    received: int = 0
    expected: int = 0
    in_order: bool = False
    flow_stopped_count: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every check held."""
        return not self.problems


class AdminRefused(RuntimeError):
    """The admin API refused the demo's credentials (HTTP 401/403)."""


def producer_label(pid: str) -> str:
    """How the demo names a producer everywhere: ``producer A (capacity 50)``."""
    return f"producer {pid} (capacity {CAPACITIES[pid]})"


# -- admin API ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Admin:
    """The gateway's admin API, with HTTP basic credentials when it needs them."""

    url: str
    user: str | None = None
    password: str | None = None

    @classmethod
    def of(cls, url: str, user: str | None, password: str | None) -> _Admin:
        """Credentials from the options, else from the URL's user info."""
        parts = urlsplit(url)
        if parts.username and user is None:
            user, password = unquote(parts.username), unquote(parts.password or "")
        netloc = parts.hostname or "127.0.0.1"
        if parts.port:
            netloc += f":{parts.port}"
        return cls(urlunsplit((parts.scheme, netloc, parts.path, "", "")), user, password)

    def queue(self, vhost: str, queue: str) -> dict[str, Any] | None:
        """The queue's admin view, None when not (yet) answerable.

        Raises:
            AdminRefused: the admin API refused the credentials.
        """
        path = f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}"
        request = urllib.request.Request(self.url.rstrip("/") + path)
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                hint = (
                    "pass --admin-user and --admin-password (the gateway's --admin-users)"
                    if exc.code == 401
                    else "the admin API refused the request (Host not allowed: see "
                    "--admin-allowed-hosts)"
                )
                raise AdminRefused(
                    f"the admin API at {self.url} answered HTTP {exc.code}: {hint}"
                ) from None
            return None
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return body if isinstance(body, dict) else None


# -- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _rabbitmq(options: DemoOptions, printer: _Printer) -> Iterator[tuple[str, str]]:
    url = options.rabbitmq_url or os.environ.get("RABBITMQ_URL") or DEFAULT_RABBITMQ_URL
    host, port = host_port(url)
    if amqp_handshake_ok(host, port, timeout=3):
        management = (
            options.management_url
            or os.environ.get("RABBITMQ_MANAGEMENT_URL")
            or f"http://{host}:15672"
        )
        printer.plain(f"RabbitMQ: {host}:{port} (management {management})")
        yield url, management
        return
    if not rabbitmq_available():
        raise RuntimeError(f"no RabbitMQ answers at {host}:{port} and rabbitmq-server is missing")
    printer.plain(f"No RabbitMQ at {host}:{port}: starting a throwaway node ...")
    # Usually up in about 10 s; a loaded machine can take several times that.
    with RabbitMQNode(management=True, start_timeout_s=120.0) as node:
        management_url = node.management_url
        assert management_url is not None
        printer.plain(f"RabbitMQ: throwaway node at {node.url}")
        yield node.url, management_url


def _declare(url: str, queue: str) -> None:
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as connection:
        connection.channel().queue_declare(
            queue,
            durable=True,
            arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME},
        )


def _delete(url: str, queue: str) -> None:
    with (
        contextlib.suppress(Exception),
        contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as connection,
    ):
        connection.channel().queue_delete(queue)


def run(options: DemoOptions, out: TextIO | None = None) -> DemoResult:
    """Run the demo, printing as it goes; return what it observed.

    Raises:
        RuntimeError: no RabbitMQ reachable and none can be started.
        pika.exceptions.AMQPError: the gateway refused the demo queue.
    """
    printer = _Printer(out if out is not None else sys.stdout)
    with contextlib.ExitStack() as stack:
        sink = _DemoSink()
        gateway: _InProcessGateway | None = None
        if options.gateway_url is not None:
            gateway_url = options.gateway_url
            admin_url = options.admin_url or "http://127.0.0.1:15673"
            printer.plain(f"Gateway: {gateway_url} (admin {admin_url}), already running")
        else:
            upstream, management_url = stack.enter_context(_rabbitmq(options, printer))
            gateway = _InProcessGateway(upstream, management_url, sink)
            gateway.start()
            stack.callback(gateway.stop)
            gateway_url = _with_credentials(f"amqp://127.0.0.1:{gateway.service.port}", upstream)
            admin_url = f"http://127.0.0.1:{gateway.service.admin_port}"
            printer.plain(f"Gateway: started in-process at {gateway_url} (admin {admin_url})")
        target = _Target(gateway, gateway_url, admin_url)
        return _run_against(options, printer, sink, target, stack)


@dataclass(frozen=True)
class _Target:
    gateway: _InProcessGateway | None
    gateway_url: str
    admin_url: str


def _run_against(
    options: DemoOptions,
    printer: _Printer,
    sink: _DemoSink,
    target: _Target,
    stack: contextlib.ExitStack,
) -> DemoResult:
    gateway, gateway_url = target.gateway, target.gateway_url
    admin = _Admin.of(target.admin_url, options.admin_user, options.admin_password)
    vhost = unquote(urlsplit(gateway_url).path.lstrip("/")) or "/"
    queue = f"rabbitflow-demo-{uuid.uuid4().hex[:8]}"
    bound = STOP + sum(CAPACITIES.values())
    result = DemoResult(queue=queue, bound=bound, expected=options.messages * len(CAPACITIES))
    _declare(gateway_url, queue)
    stack.callback(_delete, gateway_url, queue)
    if admin.queue(vhost, queue) is None and gateway is None:
        printer.plain(f"(the admin API at {admin.url} does not answer yet)")
    capacities = " and ".join(producer_label(pid) for pid in CAPACITIES)
    printer.plain(
        f"Queue {queue}: qpid.flow_stop_count={STOP}, qpid.flow_resume_count={RESUME}; "
        f"{capacities}, {options.messages} messages each; "
        f"bound {STOP} + {' + '.join(map(str, CAPACITIES.values()))} = {bound}"
    )
    printer.plain()
    printer.plain("Phase 1: both producers send as fast as their window allows")
    narrator = _Narrator(printer)
    result.producers = [ProducerStats(pid, cap) for pid, cap in CAPACITIES.items()]

    def names() -> dict[str, str]:
        return {p.sdk_id: producer_label(p.pid) for p in result.producers if p.sdk_id}

    def on_event(event: Event) -> None:
        record = event.to_record()
        if record.get("queue") in (queue, None) or event.code.startswith("CHN"):
            result.events[event.code] += 1
            narrator.event(event.code, event.line())

    sink.on_event = on_event
    client_log = logging.getLogger("rabbitflow.client")
    handler = _ClientLogHandler(narrator, names)
    client_log.addHandler(handler)
    old_level = client_log.level
    client_log.setLevel(logging.INFO)
    stack.callback(client_log.setLevel, old_level)
    stack.callback(client_log.removeHandler, handler)

    halt = threading.Event()
    consumer_go = threading.Event()
    stack.callback(halt.set)
    stack.callback(consumer_go.set)
    threads = [
        threading.Thread(
            target=_producer,
            args=(gateway_url, queue, stats, options.messages, halt),
            name=f"producer-{stats.pid}",
            daemon=True,
        )
        for stats in result.producers
    ]
    consumer_state = _ConsumerState()
    consumer = threading.Thread(
        target=_consumer,
        kwargs={
            "url": gateway_url,
            "queue": queue,
            "state": consumer_state,
            "expected": result.expected,
            "rate": options.consume_rate,
            "start": consumer_go,
            "halt": halt,
        },
        name="consumer",
        daemon=True,
    )
    for thread in [*threads, consumer]:
        thread.start()

    deadline = time.monotonic() + DEADLINE_S
    next_line = 0.0
    last: dict[str, Any] = {}
    last_stopped: bool | None = None
    consumer_since: float | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        depth = gateway.depth(vhost, queue) if gateway is not None else None
        snapshot = admin.queue(vhost, queue) if depth is None or now >= next_line else None
        if snapshot is not None:
            last = snapshot
            if depth is None:
                depth = int(snapshot.get("messages", 0))
            stopped = bool(snapshot.get("flowStopped"))
            if gateway is None and last_stopped is not None and stopped != last_stopped:
                # No event stream from a remote gateway: report the transition the admin API shows.
                code = "QUE-1003" if stopped else "QUE-1004"
                result.events[code] += 1
                word = "Overfull" if stopped else "Underfull"
                narrator.event(
                    code,
                    f"[vh({vhost})/qu({queue})] {code} : {word} (observed through the admin API)",
                )
            last_stopped = stopped
        if depth is not None:
            result.peak = max(result.peak, depth)
            narrator.observe(depth)
        if not consumer_go.is_set():
            blocked = len(last.get("blockedChannels") or [])
            sent_all = all(p.sent >= options.messages or p.error for p in result.producers)
            if (last.get("flowStopped") and blocked >= len(CAPACITIES)) or sent_all:
                consumer_since = now
                consumer_go.set()
                narrator.note(
                    f"both producers blocked: the consumer starts ({options.consume_rate:g} msg/s)"
                )
            elif now > deadline - DEADLINE_S + 20:
                consumer_go.set()
                narrator.note("producers not both blocked after 20 s: consumer starts anyway")
        if now >= next_line and last:
            next_line = now + options.interval
            sent = " ".join(f"{p.pid}={p.sent}" for p in result.producers)
            bar = "#" * min(40, (depth or 0) * 40 // bound)
            narrator.depth(
                f"depth {depth:4d} |{bar:<40}| flow {'ON ' if last.get('flowStopped') else 'OFF'} "
                f"blocked channels {len(last.get('blockedChannels') or [])}  "
                f"sent {sent}  received {len(consumer_state.received)}"
            )
        producers_done = not any(t.is_alive() for t in threads)
        if producers_done and not consumer.is_alive():
            break
        if consumer_state.error or (producers_done and consumer_since is None):
            consumer_go.set()
        time.sleep(0.005 if gateway is not None else 0.02)
    else:
        result.problems.append(f"not finished within {DEADLINE_S:.0f} s")
    halt.set()
    for thread in [*threads, consumer]:
        thread.join(timeout=10)

    final = admin.queue(vhost, queue) or last
    result.flow_stopped_count = int(final.get("flowStoppedCount", 0))
    result.received = len(consumer_state.received)
    result.in_order = _in_order(
        consumer_state.received, dict.fromkeys(CAPACITIES, options.messages)
    )
    _check(result, consumer_state)
    _summary(printer, result)
    return result


def _in_order(received: Sequence[str], counts: dict[str, int]) -> bool:
    per: dict[str, list[int]] = {pid: [] for pid in counts}
    for text in received:
        pid, _, seq = text.partition(":")
        if pid not in per or not seq.isdigit():
            return False
        per[pid].append(int(seq))
    return all(per[pid] == list(range(n)) for pid, n in counts.items())


def _check(result: DemoResult, consumer: _ConsumerState) -> None:
    if result.peak > result.bound:
        result.problems.append(f"peak depth {result.peak} above the bound {result.bound}")
    for code in ("QUE-1003", "QUE-1004"):
        if not result.events[code]:
            result.problems.append(f"no {code} seen")
    for stats in result.producers:
        if stats.error:
            result.problems.append(f"producer {stats.pid} failed: {stats.error}")
    if consumer.error:
        result.problems.append(f"consumer failed: {consumer.error}")
    if result.received != result.expected or not result.in_order:
        result.problems.append(
            f"received {result.received} of {result.expected}, "
            f"{'in order' if result.in_order else 'NOT exactly once in order'}"
        )


def _summary(printer: _Printer, result: DemoResult) -> None:
    bound_check = "OK" if result.peak <= result.bound else "EXCEEDED"
    events = ", ".join(f"{code} x{n}" for code, n in sorted(result.events.items())) or "none"
    printer.plain()
    printer.plain("Summary")
    printer.plain(f"  queue                 {result.queue} (stop {STOP} / resume {RESUME})")
    printer.plain(f"  peak depth            {result.peak} (bound {result.bound}): {bound_check}")
    printer.plain(f"  flowStoppedCount      {result.flow_stopped_count}")
    printer.plain(f"  events                {events}")
    for p in result.producers:
        printer.plain(
            f"  {producer_label(p.pid)}  sent {p.sent}, waited {p.waited_s:.2f} s "
            f"in {p.waits} sends (longest {p.longest_wait_s:.2f} s)"
        )
    printer.plain(f"  consumer              received {result.received} of {result.expected}")
    once = "OK" if result.in_order and result.received == result.expected else "FAILED"
    printer.plain(f"  exactly once, in order {once}")
    printer.plain(f"  result                {'OK' if result.ok else '; '.join(result.problems)}")


def wait_for_gateway(url: str, timeout_s: float, *, interval_s: float = 0.5) -> bool:
    """Whether the gateway at the AMQP ``url`` answers a handshake within
    ``timeout_s`` (retried every ``interval_s``; a container starting beside it
    may take a while)."""
    from rabbitflow_broker.server.rabbitmq_node import amqp_handshake_ok

    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 5672
    deadline = time.monotonic() + timeout_s
    while True:
        if amqp_handshake_ok(host, port, timeout=min(2.0, max(timeout_s, 0.1))):
            return True
        if time.monotonic() + interval_s > deadline:
            return False
        time.sleep(interval_s)


def build_parser() -> argparse.ArgumentParser:
    """The ``rabbitflow-demo`` argument parser."""
    from rabbitflow_broker.version import __version__

    # The module docstring, as plain text: no reST markup in --help.
    description = "\n\n".join(__doc__.replace("``", "").split("\n\n")[:2])
    parser = argparse.ArgumentParser(
        prog="rabbitflow-demo",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        type=str.lower,
        default="warning",
        help="log records of other libraries at this level and above to stderr (warning)",
    )
    parser.add_argument(
        "--wait",
        type=int,
        default=60_000,
        metavar="MS",
        help="with --gateway-url: how long to wait for the gateway to answer (60000 ms)",
    )
    parser.add_argument("--messages", type=int, default=500, help="messages per producer (500)")
    parser.add_argument(
        "--consume-rate", type=float, default=100.0, help="consumer messages per second (100)"
    )
    parser.add_argument("--gateway-url", help="use this running gateway (AMQP URL)")
    parser.add_argument("--admin-url", help="its admin API (default http://127.0.0.1:15673)")
    parser.add_argument("--admin-user", help="admin API user (the gateway's --admin-users)")
    parser.add_argument(
        "--admin-password",
        help="admin API password (default $RABBITFLOW_ADMIN_PASSWORD)",
    )
    parser.add_argument("--rabbitmq-url", help="RabbitMQ for the in-process gateway")
    parser.add_argument("--management-url", help="RabbitMQ management API")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; 0 when every check of the summary holds."""
    args = build_parser().parse_args(argv)
    if args.messages < 1 or args.consume_rate <= 0:
        print("rabbitflow-demo: --messages and --consume-rate must be positive", file=sys.stderr)
        return 2
    if args.wait < 0:
        print("rabbitflow-demo: --wait must not be negative", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    if args.gateway_url and not wait_for_gateway(args.gateway_url, args.wait / 1000):
        print(
            f"rabbitflow-demo: the gateway at {without_password(args.gateway_url)} did not "
            f"answer within {args.wait} ms",
            file=sys.stderr,
        )
        return 1
    options = DemoOptions(
        messages=args.messages,
        consume_rate=args.consume_rate,
        gateway_url=args.gateway_url,
        admin_url=args.admin_url,
        admin_user=args.admin_user,
        admin_password=args.admin_password or os.environ.get("RABBITFLOW_ADMIN_PASSWORD"),
        rabbitmq_url=args.rabbitmq_url,
        management_url=args.management_url,
    )
    try:
        with _quiet_structlog():
            result = run(options)
    except AdminRefused as exc:
        print(f"rabbitflow-demo: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError, pika.exceptions.AMQPError) as exc:
        print(f"rabbitflow-demo: {exc!r}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
