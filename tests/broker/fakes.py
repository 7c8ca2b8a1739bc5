"""In-memory fakes shared by the relay unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pamqp.base import Frame

from rabbitflow_broker.engine.amqp import FRAME_HEARTBEAT, PROTOCOL_HEADER
from rabbitflow_broker.hub.gateway import BlockedChannel
from tests.broker.frame_reader import FrameReader, decode_method

if TYPE_CHECKING:
    from rabbitflow_broker.hub.gateway import Gateway
    from rabbitflow_broker.server.read_pause import ReadPause
    from rabbitflow_broker.server.relay import Relay


class RecordingOwner:
    """The pump's owner (:class:`~rabbitflow_broker.server.relay_pump.Owner`): records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def abort(self) -> None:
        self.calls.append(("abort", None))

    def read_client(self, reading: bool) -> None:
        self.calls.append(("read_client", reading))

    def set_timer(self, deadline: float | None) -> None:
        self.calls.append(("set_timer", deadline))


class FakeLoop:
    """An event loop's ``call_soon``: callbacks wait until :meth:`turn` runs them."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] = []

    def call_soon(self, callback: Callable[[], object]) -> object:
        self.callbacks.append(callback)
        return None

    def turn(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


async def wait_until(
    predicate: Callable[[], object],
    what: str,
    *,
    timeout: float = 5.0,
    interval: float = 0.0,
    state: Callable[[], object] | None = None,
) -> None:
    """Poll ``predicate`` between turns of the event loop (``interval``
    seconds apart) until it is true.

    Raises:
        AssertionError: it was still false after ``timeout`` seconds; the
            message says what was awaited (and ``state()`` when given).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            detail = f" (state: {state()!r})" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        await asyncio.sleep(interval)


class RefreshWatch:
    """Wraps a gateway's ``on_change`` (the relays'
    :class:`~rabbitflow_broker.server.refresher.Refresher`) to tell whether a pass it
    was asked for may still be due.

    The refresher runs its pass with ``call_soon``; a marker queued right
    behind it (the event loop runs callbacks in the order they were queued)
    proves the pass has run, together with the writes it made.
    """

    def __init__(self, gateway: Gateway) -> None:
        inner = gateway.on_change
        assert inner is not None, "a relay installs the refresher"
        self._inner = inner
        #: Passes asked for whose marker has not run yet.
        self.pending = 0
        gateway.on_change = self

    def __call__(self) -> None:
        self._inner()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the loop the refresher ran at once
            return
        self.pending += 1
        loop.call_soon(self._ran)

    def _ran(self) -> None:
        self.pending -= 1


class FakeWriter:
    """Collects what the relay writes to one side."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        self.data += data

    def writelines(self, list_of_data: Iterable[bytes | memoryview]) -> None:
        for data in list_of_data:
            self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 50514) if name == "peername" else None

    def methods(self) -> list[tuple[int, Frame]]:
        """Method frames written so far, as (channel, method)."""
        buffer, frames = FrameReader(expect_protocol_header=False).feed(
            bytes(self.data).removeprefix(PROTOCOL_HEADER)
        )
        return [(f.channel, decode_method(f.payload(buffer))) for f in frames if f.kind == 1]

    def heartbeats(self) -> int:
        """Heartbeat frames written so far."""
        _, frames = FrameReader(expect_protocol_header=False).feed(
            bytes(self.data).removeprefix(PROTOCOL_HEADER)
        )
        return sum(f.kind == FRAME_HEARTBEAT for f in frames)

    def take(self) -> list[tuple[int, Frame]]:
        got = self.methods()
        self.data.clear()
        return got

    def take_methods(self) -> list[Frame]:
        """Like :meth:`take`, without the channel numbers."""
        return [value for _, value in self.take()]


class FakeTransport(FakeWriter):
    """An in-memory transport for one side of a relay.

    The relay writes to it (:attr:`data`); the test feeds it bytes with
    :meth:`feed_data` / :meth:`feed_eof`, which reach the attached protocol
    only while reading is not paused, as with a socket.
    """

    def __init__(self) -> None:
        super().__init__()
        self.protocol: asyncio.Protocol | None = None
        self.paused = False
        self.lost = False
        self._inbox: list[bytes | None] = []

    @property
    def pending(self) -> int:
        """Chunks (and the EOF) fed but not yet handed to the protocol."""
        return len(self._inbox)

    def attach(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol
        protocol.connection_made(self)  # type: ignore[arg-type]

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        asyncio.get_running_loop().call_soon(self._deliver)

    def feed_data(self, data: bytes) -> None:
        self._inbox.append(data)
        self._deliver()

    def feed_eof(self) -> None:
        self._inbox.append(None)
        self._deliver()

    def _deliver(self) -> None:
        while self.protocol is not None and self._inbox and not self.paused and not self.closed:
            item = self._inbox.pop(0)
            if item is None:
                if not self.protocol.eof_received():
                    self.close()
                return
            self.protocol.data_received(item)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self._lose)

    def abort(self) -> None:
        self.close()

    def _lose(self) -> None:
        if not self.lost and self.protocol is not None:
            self.lost = True
            protocol, self.protocol = self.protocol, None  # as asyncio's transports do
            protocol.connection_lost(None)


#: A heartbeat frame: the relay passes it on either way at once, so once it
#: is through, everything fed before it has been handled.
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def connected_relay(
    gateway: Gateway, read_pause: ReadPause | None = None
) -> tuple[Relay, FakeTransport, FakeTransport]:
    """A relay on in-memory transports: (relay, client side, upstream side).

    The upstream connection opens as soon as the event loop runs.
    """
    from rabbitflow_broker.server.relay import Relay

    upstream = FakeTransport()

    async def connect(host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> Any:
        upstream.attach(factory())
        return upstream

    client = FakeTransport()
    relay = (
        Relay(gateway, connector=connect)
        if read_pause is None
        else Relay(gateway, connector=connect, read_pause=read_pause)
    )
    client.attach(relay)
    return relay, client, upstream


class IdleConnection:
    """A connection as the gateway's admin views see it: no channels, nothing
    flowed, ``held`` confirms held."""

    def __init__(self, number: int = 1, held: int = 0) -> None:
        self.number = number
        self.held = held

    def held_confirms(self) -> int:
        return self.held

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        return []

    def channel_count(self) -> int:
        return 0

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        return []

    def count_unacked(self, into: dict[tuple[str, str], int]) -> None:
        return None
