"""In-memory fakes for the client's unit tests: a clock, a condition wait that
advances it, and a transport/channel pair that records what the SDK does and
can emit what a broker would (confirms, nacks, Channel.Flow, blocked)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rabbitflow
from rabbitflow._exceptions import InvalidDestinationError
from rabbitflow._message import WireProperties
from rabbitflow._transport_base import DETACHED as _DETACHED
from rabbitflow._transport_base import Delivery
from rabbitflow._transport_frames import PublishEncoder


class FakeClock:
    """Monotonic seconds that only move when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class AdvancingWait:
    """Stands in for Condition.wait: instead of blocking, moves the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waits: list[float] = []
        self.limit = 10_000
        # Broker-side events to play while a caller waits, one per wait call.
        self.during_wait: list[Callable[[], None]] = []

    def __call__(self, _condition: threading.Condition, timeout: float) -> None:
        self.waits.append(timeout)
        if len(self.waits) > self.limit:
            raise AssertionError("send waited forever")
        self.clock.advance(timeout)
        if self.during_wait:
            self.during_wait.pop(0)()


def encode_all(
    channel: int, items: list[tuple[str, str, bytes, WireProperties]], mandatory: bool
) -> None:
    """Encode a batch as the real channels do before writing any of it: a
    publish AMQP cannot carry fails the whole batch with their error."""
    encoder = PublishEncoder()
    try:
        for exchange, routing_key, body, props in items:
            encoder.encode(
                channel, exchange, routing_key, body, props, mandatory=mandatory, body_max=4088
            )
    except (ValueError, TypeError, struct.error) as exc:
        raise rabbitflow.ProtocolError(f"cannot encode a publish: {exc}") from exc


@dataclass
class Published:
    channel: int
    tag: int
    exchange: str
    routing_key: str
    body: bytes
    props: WireProperties


@dataclass
class FakeBroker:
    """What the fake transports share: queues, exchanges, bindings, publishes."""

    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    exchanges: dict[str, str] = field(default_factory=dict)
    bindings: list[tuple[str, str, str]] = field(default_factory=list)
    published: list[Published] = field(default_factory=list)
    # What transacted channels committed, in commit order (as the broker enqueues it).
    committed: list[Published] = field(default_factory=list)
    transports: list[FakeTransport] = field(default_factory=list)
    # Faults for the transports made later, by their index in ``transports``:
    # lose the connection at its k-th channel open, or at its first publish.
    lose_at_channel_open: dict[int, int] = field(default_factory=dict)
    lose_at_first_publish: set[int] = field(default_factory=set)
    # ... send connection.blocked just before its k-th channel open.
    block_at_channel_open: dict[int, int] = field(default_factory=dict)
    # ... send connection.blocked as its handshake ends, before connect() returns.
    block_at_connect: set[int] = field(default_factory=set)
    # (transport index, k) -> what to play just after its k-th channel opened,
    # before the SDK has the channel.
    after_channel_open: dict[tuple[int, int], Callable[[], None]] = field(default_factory=dict)
    # (transport index, channel number) -> what to play while that channel's
    # tx.rollback is on its way, before the broker answers it.
    at_tx_rollback: dict[tuple[int, int], Callable[[], None]] = field(default_factory=dict)
    # ... while its tx.commit is on its way.
    at_tx_commit: dict[tuple[int, int], Callable[[], None]] = field(default_factory=dict)
    # ... while its confirm.select or tx.select is on its way (then a dead
    # channel raises, as the real one does).
    at_select: dict[tuple[int, int], Callable[[], None]] = field(default_factory=dict)
    refusing: bool = False  # every later connect is refused
    server_named: int = 0  # server-named queues declared so far (amq.gen-N)


class FakeChannel:
    """Records calls; ``emit_*`` play the broker's side."""

    def __init__(self, transport: FakeTransport, number: int, handler: Any) -> None:
        self.transport = transport
        self.number = number
        self.handler = handler
        self.closed = False
        self.confirming = False
        self.transactional = False
        self.next_tag = 1
        self.detached = False  # the SDK left it: emit_* reach nobody
        self.calls: list[tuple[Any, ...]] = []
        self.uncommitted: list[Published] = []  # this transaction's publishes

    @property
    def broker(self) -> FakeBroker:
        return self.transport.broker

    def confirm_select(self) -> None:
        self._play_at_select()
        self.confirming = True

    def tx_select(self) -> None:
        self._play_at_select()
        self.transactional = True

    def _play_at_select(self) -> None:
        # Without a fault played here a select passes even on a lost
        # connection: tests that lose it just after a channel opened take
        # the select as one that got its answer before the loss.
        play = self.broker.at_select.pop((self.transport.index, self.number), None)
        if play is not None:
            play()
            self._check_alive()

    def _check_alive(self) -> None:
        """A channel of a lost connection (or closed) answers nothing: the
        real one raises ConnectionLostError."""
        if self.transport.lost or self.closed:
            raise rabbitflow.ConnectionLostError("fake channel is gone")

    def tx_commit(self) -> None:
        play = self.broker.at_tx_commit.pop((self.transport.index, self.number), None)
        if play is not None:
            play()
        self._check_alive()
        self.calls.append(("tx_commit",))
        self.broker.committed.extend(self.uncommitted)
        self.uncommitted.clear()

    def tx_rollback(self) -> None:
        play = self.broker.at_tx_rollback.pop((self.transport.index, self.number), None)
        if play is not None:
            play()
        self._check_alive()
        self.calls.append(("tx_rollback",))
        self.uncommitted.clear()

    def queue_declare(
        self, name: str, *, passive: bool = False, arguments: Any = None, **kw: Any
    ) -> tuple[str, int, int]:
        if passive:
            if name not in self.broker.queues:
                self.closed = True
                raise InvalidDestinationError(f"404 no queue {name!r}", reply_code=404)
        else:
            if not name:
                name = f"amq.gen-{self.broker.server_named}"
                self.broker.server_named += 1
            self.broker.queues.setdefault(name, {"arguments": arguments, **kw})
        return name, 0, 0

    def exchange_declare(self, name: str, kind: str, *, passive: bool = False, **_kw: Any) -> None:
        if passive and name not in self.broker.exchanges:
            self.closed = True
            raise InvalidDestinationError(f"404 no exchange {name!r}", reply_code=404)
        self.broker.exchanges.setdefault(name, kind)

    def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        self.broker.bindings.append((queue, exchange, routing_key))

    def queue_delete(self, queue: str) -> None:
        self.broker.queues.pop(queue, None)

    def basic_consume_nowait(self, queue: str, **_kw: Any) -> None:
        self.calls.append(("consume", queue))

    def basic_cancel_nowait(self, on_ok: Callable[[], None] | None = None) -> None:
        self.calls.append(("cancel",))
        if on_ok is not None:  # this broker confirms at once
            on_ok()

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        self.calls.append(("depth", queue))
        on_depth(self.broker.queues.get(queue, {}).get("depth", 0))

    def qos_nowait(self, count: int, on_ok: Callable[[], None] | None = None) -> None:
        self.calls.append(("qos", count))
        if on_ok is not None:  # this broker confirms at once
            on_ok()

    def ack(self, tag: int, *, multiple: bool) -> None:
        self.calls.append(("ack", tag, multiple))

    def publish(
        self, exchange: str, routing_key: str, body: bytes, props: WireProperties, mandatory: bool
    ) -> None:
        self._check_alive()
        if self.transport.index in self.broker.lose_at_first_publish:
            self.broker.lose_at_first_publish.discard(self.transport.index)
            self.transport.emit_lost()
            raise rabbitflow.ConnectionLostError("fake connection cut at a publish")
        tag = self.next_tag
        self.next_tag += 1
        published = Published(self.number, tag, exchange, routing_key, body, props)
        self.broker.published.append(published)
        if self.transactional:
            self.uncommitted.append(published)

    def publish_many(
        self, items: list[tuple[str, str, bytes, WireProperties]], mandatory: bool
    ) -> None:
        encode_all(self.number, items, mandatory)
        for exchange, routing_key, body, props in items:
            self.publish(exchange, routing_key, body, props, mandatory)

    def close(self) -> None:
        self.closed = True

    def detach(self) -> None:
        self.detached = True
        self.handler = _DETACHED

    # ----------------------------------------------------------- broker side
    def emit_ack(self, tag: int, multiple: bool = False) -> None:
        if not self.detached:
            self.handler.on_confirm(tag, multiple, True)

    def emit_nack(self, tag: int, multiple: bool = False) -> None:
        if not self.detached:
            self.handler.on_confirm(tag, multiple, False)

    def emit_flow(self, active: bool) -> None:
        if not self.detached:
            self.handler.on_flow(active)

    def emit_closed(self, error: rabbitflow.JMSException) -> None:
        self.closed = True
        self.handler.on_channel_closed(error)

    def emit_deliver(
        self,
        tag: int,
        body: bytes,
        *,
        redelivered: bool = False,
        properties: WireProperties | None = None,
    ) -> None:
        if self.detached:
            return
        props = properties or WireProperties(content_type="text/plain")
        self.handler.on_deliver(Delivery(tag, redelivered, "", "q", body, props))


class FakeTransport:
    """Runs posted work at once (there is no I/O thread) unless told to hold
    it; timers wait for ``fire_timers``."""

    def __init__(self, broker: FakeBroker, url: str, listener: Any, **_kw: Any) -> None:
        self.broker = broker
        self.url = url
        self.listener = listener
        self.channels: list[FakeChannel] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.closing = False
        self.lost = False
        self.connected = False
        self.fail_connect: Exception | None = None
        self.held_posts: list[Callable[[], None]] | None = None

    @property
    def alive(self) -> bool:
        return self.connected and not (self.closing or self.lost)

    def connect(self) -> None:
        if self.fail_connect is not None:
            raise self.fail_connect
        self.connected = True
        if self.index in self.broker.block_at_connect:
            self.emit_blocked()

    @property
    def index(self) -> int:
        return self.broker.transports.index(self)

    def open_channel(self, handler: Any) -> FakeChannel:
        if not self.alive:
            raise rabbitflow.ConnectionLostError("fake transport is not connected")
        if self.broker.lose_at_channel_open.get(self.index) == len(self.channels) + 1:
            self.emit_lost()
            raise rabbitflow.ConnectionLostError("fake connection cut at a channel open")
        if self.broker.block_at_channel_open.get(self.index) == len(self.channels) + 1:
            self.emit_blocked()
        channel = FakeChannel(self, len(self.channels) + 1, handler)
        self.channels.append(channel)
        play = self.broker.after_channel_open.pop((self.index, channel.number), None)
        if play is not None:
            play()
        return channel

    def post(self, fn: Callable[[], None]) -> None:
        if self.held_posts is not None:
            self.held_posts.append(fn)
            return
        fn()

    def hold_posts(self) -> None:
        """Queue posted work (as a busy I/O thread would) until ``run_posts``."""
        self.held_posts = []

    def run_posts(self) -> None:
        posts, self.held_posts = self.held_posts or [], None
        for fn in posts:
            fn()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.timers.append((delay, fn))

    def fire_timers(self) -> None:
        timers, self.timers = self.timers, []
        for _delay, fn in timers:
            fn()

    def close(self) -> None:
        self.closing = True

    # ----------------------------------------------------------- broker side
    def emit_blocked(self, reason: str = "low on memory") -> None:
        self.listener.on_blocked(reason)

    def emit_unblocked(self) -> None:
        self.listener.on_unblocked()

    def emit_lost(self) -> None:
        self.lost = True
        self.listener.on_lost(rabbitflow.ConnectionLostError("fake connection lost"))


@dataclass
class Harness:
    """A factory wired to fakes, and handles to play the broker."""

    broker: FakeBroker
    clock: FakeClock
    wait: AdvancingWait
    sleeps: list[float]
    factory: rabbitflow.ConnectionFactory

    @property
    def transport(self) -> FakeTransport:
        return self.broker.transports[-1]


def make_harness(
    properties: dict[str, Any] | None = None,
    url: str | list[str] = "amqp://fake/",
    down: set[str] | None = None,
) -> Harness:
    """A ConnectionFactory over the fakes."""
    broker = FakeBroker()
    clock = FakeClock()
    wait = AdvancingWait(clock)
    sleeps: list[float] = []

    def transport_factory(url: str, listener: Any, **kw: Any) -> FakeTransport:
        transport = FakeTransport(broker, url, listener, **kw)
        if down is not None and url in down:
            transport.fail_connect = rabbitflow.ConnectionLostError(f"fake {url} is down")
        if broker.refusing:
            transport.fail_connect = rabbitflow.ConnectionLostError("refused")
        broker.transports.append(transport)
        return transport

    factory = rabbitflow.ConnectionFactory(
        url,
        properties=properties,
        _transport_factory=transport_factory,  # type: ignore[arg-type]
        _sleep=sleeps.append,
        _clock=clock,
        _wait=wait,
    )
    return Harness(broker, clock, wait, sleeps, factory)


def harness_session(
    *,
    queue: str | None = "orders",
    start: bool = True,
    transacted: bool = False,
    acknowledge_mode: int = rabbitflow.AUTO_ACKNOWLEDGE,
) -> tuple[Harness, rabbitflow.Connection, rabbitflow.Session]:
    """A harness whose broker has ``queue`` (none if None), and a session on a
    new connection of its factory, started before the session if ``start``."""
    h = make_harness()
    if queue is not None:
        h.broker.queues[queue] = {}
    connection = h.factory.create_connection()
    if start:
        connection.start()
    return h, connection, connection.create_session(transacted, acknowledge_mode)


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Return once ``predicate()`` holds; fail after 5 s naming ``what``."""
    event = threading.Event()
    for _ in range(500):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def lose_and_recover(h: Harness, connection: rabbitflow.Connection) -> Callable[[], None]:
    """A play that drops the connection's transport in use now and returns
    once recovery restored it."""
    lost = h.transport
    count = connection.reconnect_count

    def play() -> None:
        lost.emit_lost()
        wait_for(lambda: connection.reconnect_count == count + 1, "the reconnection")

    return play
