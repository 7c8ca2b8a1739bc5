"""What runs on the threads of ``rabbitflow-demo`` (:mod:`rabbitflow_broker.cli.demo`).

The in-process gateway on its own event-loop thread, the two producers
(rabbitflow SDK, each on a thread, counting how long flow control held
their sends) and the slow consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from rabbitflow_broker.admin.api import create_app
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.server.service import EventSink, GatewayService

__all__ = ["ProducerStats"]

#: A send() taking longer than this was held by flow control or a full window.
_WAIT_EPSILON_S = 0.005


@dataclass
class ProducerStats:
    """One producer's side of the run."""

    pid: str
    capacity: int
    #: The SDK's own name for it (``producer-N``), seen in its log lines.
    sdk_id: str = ""
    sent: int = 0
    waited_s: float = 0.0
    longest_wait_s: float = 0.0
    waits: int = 0
    error: str | None = None


# -- the gateway ----------------------------------------------------------------------


class _InProcessGateway:
    """A GatewayService on free ports, driven by its own event-loop thread."""

    def __init__(self, upstream: str, management_url: str, sink: EventSink) -> None:
        self.config = GatewayConfig(
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            upstream=upstream,
            management_url=management_url,
        )
        self.service = GatewayService(self.config, sink=sink, admin_app=create_app)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.service.start(), self._loop).result(timeout=60)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.service.stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def depth(self, vhost: str, queue: str) -> int:
        """The gateway's own count for the queue (read on its loop)."""

        async def read() -> int:
            return self.service.gateway.depth.get((vhost, queue)).messages

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=5)


def _with_credentials(url: str, base: str) -> str:
    """``url``'s host and port with ``base``'s credentials and vhost."""
    target, source = urlsplit(url), urlsplit(base)
    netloc = target.hostname or "127.0.0.1"
    if target.port:
        netloc += f":{target.port}"
    if source.username:
        netloc = f"{source.username}:{source.password or ''}@{netloc}"
    return urlunsplit(("amqp", netloc, source.path or "/%2F", "", ""))


# -- producers and consumer --------------------------------------------------------------


def _producer(
    url: str, queue: str, stats: ProducerStats, count: int, halt: threading.Event
) -> None:
    import rabbitflow

    try:
        factory = rabbitflow.ConnectionFactory(url)
        with factory.create_connection() as connection:
            session = connection.create_session()
            producer = session.create_producer(session.create_queue(queue), capacity=stats.capacity)
            stats.sdk_id = producer.id
            for seq in range(count):
                if halt.is_set():
                    break
                message = session.create_text_message(f"{stats.pid}:{seq}")
                started = time.monotonic()
                producer.send(message)
                took = time.monotonic() - started
                stats.sent += 1
                if took > _WAIT_EPSILON_S:
                    stats.waited_s += took
                    stats.waits += 1
                    stats.longest_wait_s = max(stats.longest_wait_s, took)
            producer.close()
    except Exception as exc:  # the summary reports it; the demo must not die mid-way
        stats.error = f"{type(exc).__name__}: {exc}"


@dataclass
class _ConsumerState:
    received: list[str] = field(default_factory=list)
    error: str | None = None


def _consumer(
    *,
    url: str,
    queue: str,
    state: _ConsumerState,
    expected: int,
    rate: float,
    start: threading.Event,
    halt: threading.Event,
) -> None:
    import rabbitflow

    start.wait()
    if halt.is_set():
        return
    try:
        factory = rabbitflow.ConnectionFactory(url)
        with factory.create_connection() as connection:
            # CLIENT_ACKNOWLEDGE with an acknowledge() per message: the SDK's
            # AUTO_ACKNOWLEDGE defers acks until it grants more credit, so
            # received messages would keep counting in the queue's depth.
            session = connection.create_session(
                transacted=False, acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE
            )
            consumer = session.create_consumer(session.create_queue(queue))
            connection.start()
            pause = 1.0 / rate if rate > 0 else 0.0
            while len(state.received) < expected and not halt.is_set():
                message = consumer.receive(timeout=0.5)
                if message is None:
                    continue
                state.received.append(message.body_bytes().decode())
                message.acknowledge()
                # Pacing, not waiting on a condition: this consumer is slow on purpose.
                halt.wait(pause)
            consumer.close()
    except Exception as exc:
        state.error = f"{type(exc).__name__}: {exc}"
