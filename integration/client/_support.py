"""Observers for the client integration tests, independent of the SDK.

Everything here talks to RabbitMQ with raw pika, rabbitmqctl or raw
sockets, so a test can check what the SDK did against what the broker and
the wire say, not against the SDK's own account of it.

- :func:`wait_until` polls a condition with a deadline.
- :func:`declare_queue`, :func:`publish_bodies`, :func:`ready_count`,
  :func:`drain` set up and inspect queues.
- :class:`QueueCollector` consumes a queue on a background thread;
  :class:`Sender` sends numbered messages through the SDK on one.
- :func:`set_memory_alarm` / :func:`clear_memory_alarm` drive a throwaway
  node's memory alarm; :func:`memory_alarm_active` reads it back.
- :class:`AmqpTap` is a TCP proxy that records the AMQP method frames
  crossing it (deliveries down, acks and other methods up).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from rabbitflow_broker.server.rabbitmq_node import RabbitMQNode, host_port

CLIENT_LOGGER = "rabbitflow.client"


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.02,
    state: Callable[[], object] | None = None,
) -> None:
    """Poll ``predicate`` until it is true.

    Raises:
        AssertionError: it was still false after ``timeout`` seconds; the
            message says what was awaited (and ``state()`` when given).
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            detail = f" (state: {state()})" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def declare_queue(url: str, name: str, arguments: Mapping[str, Any] | None = None) -> None:
    """Declare a durable queue with ``arguments`` (as an operator would, before the SDK)."""
    connection = _connect(url)
    try:
        connection.channel().queue_declare(name, durable=True, arguments=dict(arguments or {}))
    finally:
        connection.close()


def publish_bodies(url: str, queue: str, bodies: Iterable[bytes]) -> None:
    """Publish persistent messages to ``queue`` with publisher confirms.

    Raises:
        pika.exceptions.NackError: the broker refused one.
    """
    connection = _connect(url)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def ready_count(url: str, queue: str) -> int:
    """Ready messages in ``queue`` (passive declare)."""
    connection = _connect(url)
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def drain(url: str, queue: str) -> list[bytes]:
    """Remove and return every ready message of ``queue``, oldest first.

    Uses ``basic.get`` until the queue answers empty, so the result is the
    queue's whole content at that moment.
    """
    bodies: list[bytes] = []
    connection = _connect(url)
    try:
        channel = connection.channel()
        while True:
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
    finally:
        connection.close()


def numbers(bodies: Iterable[bytes]) -> list[int]:
    """The integers that the tests put in message bodies (``b"17"`` -> 17)."""
    return [int(body.decode()) for body in bodies]


class QueueCollector:
    """Consume ``queue`` on a background thread with raw pika, acking each message.

    ``bodies`` grows as messages arrive.  :meth:`stop` cancels the consumer
    (unprocessed prefetched messages go back to the queue) and returns the
    bodies received.
    """

    def __init__(self, url: str, queue: str) -> None:
        self._url = url
        self._queue = queue
        self._lock = threading.Lock()
        self._bodies: list[bytes] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"collector-{queue}", daemon=True)

    def start(self) -> QueueCollector:
        self._thread.start()
        wait_until(
            lambda: self._ready.is_set() or self.error is not None, 30, "the collector to consume"
        )
        if self.error is not None:
            raise AssertionError(f"collector failed to start: {self.error!r}")
        return self

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._bodies)

    def bodies(self) -> list[bytes]:
        with self._lock:
            return list(self._bodies)

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"collector failed: {self.error!r}")
        return self.bodies()

    def _run(self) -> None:
        try:
            connection = _connect(self._url)
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=200)

                def on_message(
                    ch: BlockingChannel,
                    method: pika.spec.Basic.Deliver,
                    _properties: pika.BasicProperties,
                    body: bytes,
                ) -> None:
                    with self._lock:
                        self._bodies.append(body)
                    ch.basic_ack(method.delivery_tag)

                channel.basic_consume(self._queue, on_message)
                self._ready.set()
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.05)
            finally:
                with contextlib.suppress(Exception):
                    connection.close()
        except BaseException as exc:
            self.error = exc


class Sender(threading.Thread):
    """Sends text messages numbered ``numbers`` on a thread, counting the sends that returned.

    ``before_send(n)`` (optional) runs before each send, e.g. to pace the
    stream.  A raised exception ends the thread and is kept in ``error``.
    """

    def __init__(
        self,
        producer: Any,
        session: Any,
        numbers: Iterable[int],
        before_send: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(name="sender", daemon=True)
        self._producer = producer
        self._session = session
        self._numbers = list(numbers)
        self._before_send = before_send
        self._lock = threading.Lock()
        self._returned = 0
        self.error: BaseException | None = None

    @property
    def returned(self) -> int:
        with self._lock:
            return self._returned

    def run(self) -> None:
        try:
            for n in self._numbers:
                if self._before_send is not None:
                    self._before_send(n)
                self._producer.send(self._session.create_text_message(str(n)))
                with self._lock:
                    self._returned += 1
        except BaseException as exc:
            self.error = exc


# -- memory alarms ---------------------------------------


def memory_alarm_active(node: RabbitMQNode) -> bool:
    """True when ``node`` has a memory alarm set right now.

    Asks the node itself: the management API's ``mem_alarm`` lags by its
    statistics interval (5 s).
    """
    return "resource_limit,memory" in node.ctl("eval", "rabbit_alarm:get_alarms().")


def set_memory_alarm(node: RabbitMQNode) -> None:
    """Put a throwaway node into a memory alarm (watermark far below its use)."""
    node.ctl("set_vm_memory_high_watermark", "0.0000001")


def clear_memory_alarm(node: RabbitMQNode) -> None:
    """Restore a throwaway node's usual memory watermark, which clears the alarm."""
    node.ctl("set_vm_memory_high_watermark", "0.4")


# -- log records -------------------------------------------------------------


def client_messages(records: Iterable[logging.LogRecord], level: int) -> list[str]:
    """Messages of ``rabbitflow.client`` records at exactly ``level``."""
    return [r.getMessage() for r in list(records) if r.name == CLIENT_LOGGER and r.levelno == level]


# -- the wire ----------------------------------------------------------------

_FRAME_METHOD = 1
_FRAME_END = 0xCE
BASIC = 60
BASIC_DELIVER = 60
BASIC_GET_OK = 71
BASIC_ACK = 80
BASIC_REJECT = 90
BASIC_NACK = 120


@dataclass(frozen=True)
class WireEvent:
    """One AMQP method frame seen by the tap, in the order the tap forwarded them."""

    upstream: bool  # True: client -> broker; False: broker -> client
    channel: int
    class_id: int
    method_id: int
    #: A client basic.ack's delivery tag and multiple flag (None otherwise).
    ack: tuple[int, bool] | None = None

    @property
    def is_delivery(self) -> bool:
        return (
            not self.upstream
            and self.class_id == BASIC
            and self.method_id in (BASIC_DELIVER, BASIC_GET_OK)
        )

    @property
    def is_reject(self) -> bool:
        """The client handed a delivery back (basic.reject or basic.nack)."""
        return (
            self.upstream
            and self.class_id == BASIC
            and self.method_id in (BASIC_REJECT, BASIC_NACK)
        )


class _FrameReader:
    """Splits a byte stream into AMQP frames and reports method frames (and, from the
    client, each basic.ack's delivery tag and multiple flag)."""

    def __init__(self, from_client: bool) -> None:
        self._buffer = bytearray()
        # The client's stream opens with the protocol header; its acks are decoded.
        self._skip = 8 if from_client else 0
        self._acks = from_client

    def feed(self, data: bytes) -> list[tuple[int, int, int, tuple[int, bool] | None]]:
        self._buffer += data
        if self._skip:
            taken = min(self._skip, len(self._buffer))
            del self._buffer[:taken]
            self._skip -= taken
        methods: list[tuple[int, int, int, tuple[int, bool] | None]] = []
        while len(self._buffer) >= 7:
            frame_type, channel, size = struct.unpack(">BHI", self._buffer[:7])
            if len(self._buffer) < size + 8:
                break
            if self._buffer[7 + size] != _FRAME_END:
                raise ValueError("AMQP frame without frame-end octet")
            if frame_type == _FRAME_METHOD and size >= 4:
                class_id, method_id = struct.unpack(">HH", self._buffer[7:11])
                ack = None
                if self._acks and (class_id, method_id) == (BASIC, BASIC_ACK) and size >= 13:
                    tag, bits = struct.unpack(">QB", self._buffer[11:20])
                    ack = (tag, bool(bits & 1))
                methods.append((channel, class_id, method_id, ack))
            del self._buffer[: size + 8]
        return methods


#: The most a delayed tap reads from the broker at a time.
_TRICKLE_BYTES = 128


class AmqpTap:
    """A TCP proxy in front of a broker that records the AMQP method frames it relays.

    Point a client at :attr:`url`.  Each method frame is recorded (and
    ``on_event`` called, on the relaying thread) *before* the bytes that
    complete it are forwarded, so the record order respects causality: a
    delivery the broker sent in answer to an ack appears after that ack.
    """

    def __init__(
        self,
        upstream_url: str,
        on_event: Callable[[WireEvent], None] | None = None,
        *,
        broker_delay_s: float = 0.0,
    ):
        #: Each read from the broker is held this long before it is relayed,
        #: and is then at most :data:`_TRICKLE_BYTES` (about one small
        #: delivery): a busy broker whose answers come late, a few at a time.
        self.broker_delay_s = broker_delay_s
        self._upstream = host_port(upstream_url)
        self._upstream_url = upstream_url
        self._on_event = on_event
        self._lock = threading.Lock()
        self._events: list[WireEvent] = []
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="amqp-tap", daemon=True).start()

    @property
    def url(self) -> str:
        upstream_host, upstream_port = self._upstream
        return self._upstream_url.replace(
            f"{upstream_host}:{upstream_port}", f"127.0.0.1:{self.port}", 1
        )

    def events(self) -> list[WireEvent]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> AmqpTap:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        reader = _FrameReader(from_client=upstream)
        try:
            while True:
                delayed = not upstream and self.broker_delay_s > 0
                data = source.recv(_TRICKLE_BYTES if delayed else 65536)
                if not data:
                    break
                for channel, class_id, method_id, ack in reader.feed(data):
                    event = WireEvent(upstream, channel, class_id, method_id, ack)
                    with self._lock:
                        self._events.append(event)
                    if self._on_event is not None:
                        self._on_event(event)
                if delayed:
                    time.sleep(self.broker_delay_s)
                sink.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def ack_sizes(events: Iterable[WireEvent]) -> list[int]:
    """How many deliveries each of the client's basic.ack frames acknowledged,
    in order (a multiple ack: every tag of its channel up to its own).

    With a constant prefetch each is the refill the client asked for: the
    broker may send that many more deliveries.  Unlike the runs of
    :func:`delivery_batches`, these do not depend on how the broker's answers
    interleave with the client's next request.
    """
    acked: dict[int, int] = {}
    sizes: list[int] = []
    for event in events:
        if event.ack is None:
            continue
        tag, multiple = event.ack
        last = acked.get(event.channel, 0)
        sizes.append(tag - last if multiple else 1)
        acked[event.channel] = max(last, tag)
    return sizes


def delivery_batches(events: Iterable[WireEvent], channel: int | None = None) -> list[int]:
    """Sizes of the runs of deliveries not interrupted by a client method frame.

    A refill is what the broker sends in answer to the client's request (an
    ack, a qos change, a get): the deliveries between two client method
    frames.  Runs of length 0 are skipped.  ``channel`` limits the count to
    one channel.
    """
    batches: list[int] = []
    run = 0
    for event in events:
        if channel is not None and event.channel != channel:
            continue
        if event.is_delivery:
            run += 1
        elif event.upstream and run:
            batches.append(run)
            run = 0
    if run:
        batches.append(run)
    return batches
