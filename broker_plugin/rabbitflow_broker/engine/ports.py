"""The connection engine's interface types (pure): what it needs from the
gateway (:class:`Hub`), its limits (:class:`EngineSettings`), what it asks
the driver to do (:class:`Actions`), and its byte buffers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from mypy_extensions import trait

from rabbitflow_broker.engine.amqp import (
    CONTENT_METHODS,
    FRAME_ERROR,
    UNEXPECTED_FRAME,
    ContentInfo,
    content_properties,
    u16,
    u32,
    u64,
)
from rabbitflow_broker.engine.confirms import Route
from rabbitflow_broker.engine.errors import FrameError
from rabbitflow_broker.events import Event

__all__ = ["Actions", "EngineSettings", "Hub", "Inbound", "Out", "content_unit"]


@trait
class Hub:
    """The shared gateway state one connection may use (narrow on purpose;
    no clock: the engine is given the time with each call).

    :class:`~rabbitflow_broker.hub.gateway.Gateway` implements it.  A base class
    rather than a :class:`~typing.Protocol`: compiled, the engine's calls
    into the hub are then direct calls, not Python method lookups."""

    #: True while nothing blocks any producer (no queue ON, no administrator
    #: stop, no vhost-wide block): the per-message blocking checks are skipped.
    calm: bool

    def published(self, vhost: str, route: Route, size: int) -> None:
        """A publish routed to ``route`` was relayed (or a transaction committed)."""
        raise NotImplementedError

    def removed(self, vhost: str, queue: str, messages: int, size: int) -> None:
        """Messages left a queue."""
        raise NotImplementedError

    def persistent_published(self, vhost: str, size: int) -> None:
        """Persistent bytes were routed (the store quota counts them)."""
        raise NotImplementedError

    def route_blocker(self, vhost: str) -> Callable[[Route], bool]:
        """Whether a route of the vhost is blocked, as a function."""
        raise NotImplementedError

    def blockers(self, vhost: str, route: Route) -> list[str]:
        """What blocks a route now."""
        raise NotImplementedError

    def blocker_active(self, vhost: str, blocker: str) -> bool:
        """Whether one blocker still blocks."""
        raise NotImplementedError

    def vhost_blocked(self, vhost: str) -> bool:
        """Whether every publish to the vhost is blocked."""
        raise NotImplementedError

    def route(self, vhost: str, exchange: str, key: str, headers: Any) -> Route:
        """The queues a publish is enqueued on."""
        raise NotImplementedError

    def validate_declare(self, arguments: Mapping[str, object] | None) -> None:
        """Refuse a queue declaration whose flow arguments are invalid."""
        raise NotImplementedError

    def confirmed(
        self, vhost: str, request: int, args: list[object], reply: Any, last: str
    ) -> None:
        """RabbitMQ confirmed a client's request (follow it in the routing mirror)."""
        raise NotImplementedError

    @property
    def store_quota_on(self) -> bool:
        """Whether persistent publishes are blocked by the store quota."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Per-connection limits, from the gateway's configuration."""

    flow_enforcement_timeout: float | None = 5.0  # seconds; None: never close
    handshake_timeout: float | None = 10.0
    #: Announced to clients in Connection.Start (``rabbitflow-gateway``).
    server: str = "rabbitflow-broker"


#: Bytes to write: a run of a read longer than :data:`VIEW_MIN` is a view of
#: it (the driver writes several chunks with one ``writelines``, so a large
#: read is never copied to be forwarded).
Chunk: TypeAlias = "bytes | memoryview"
#: From this length a forwarded run is passed on as a view, not copied.
VIEW_MIN: Final = 1024


class Actions:
    """What the driver must do after a call into the engine, in this order.

    A plain class, not a dataclass: compiled, its constructor is then native
    (one is made per call into the engine)."""

    __slots__ = ("close", "events", "read_client", "timer", "to_client", "to_upstream")

    def __init__(self) -> None:
        self.to_upstream: list[Chunk] = []
        self.to_client: list[Chunk] = []
        self.events: list[Event] = []
        self.read_client = True
        self.timer: float | None = None  # monotonic time to call tick() at
        self.close = False  # flush what is above, then close both sockets

    def __repr__(self) -> str:
        return (
            f"Actions(to_upstream={self.to_upstream!r}, to_client={self.to_client!r}, "
            f"events={self.events!r}, read_client={self.read_client!r}, "
            f"timer={self.timer!r}, close={self.close!r})"
        )


class Inbound:
    """One direction's byte buffer: scanned in place, compacted only when a
    frame is left incomplete."""

    __slots__ = ("expect_header", "max_frame", "need", "pending", "remaining")

    def __init__(self, max_frame: int) -> None:
        self.pending = bytearray()
        self.need = 0  # bytes ``pending`` must hold before a scan can progress
        self.max_frame = max_frame
        self.expect_header: set[int] = set()  # channels between content method and header
        self.remaining: dict[int, int] = {}  # channel -> body bytes still due

    def mid_content(self, number: int) -> bool:
        """True while a message on channel ``number`` is incomplete."""
        return number in self.expect_header or number in self.remaining

    def method(self, number: int, method: int) -> None:
        """A method frame on channel ``number``, checked against what the channel expects.

        Raises:
            FrameError: the channel's message is incomplete.
        """
        if number in self.expect_header or number in self.remaining:
            raise FrameError(UNEXPECTED_FRAME, f"method frame on channel {number} mid-content")
        if method in CONTENT_METHODS:
            self.expect_header.add(number)

    def header(self, number: int, buf: bytes, start: int, end: int) -> ContentInfo:
        """The content header ``buf[start:end]`` (its payload) on channel ``number``.

        Raises:
            FrameError: no content method before it, or a malformed header.
        """
        if number not in self.expect_header:
            raise FrameError(UNEXPECTED_FRAME, f"content header on channel {number}")
        self.expect_header.discard(number)
        info = content_properties(buf, start, end)
        if info.body_size:
            self.remaining[number] = info.body_size
        return info

    def body(self, number: int, size: int) -> None:
        """A body frame of ``size`` bytes on channel ``number``.

        Raises:
            FrameError: no header announced it, or it runs past the announced size.
        """
        remaining = self.remaining.get(number)
        if remaining is None or number == 0:
            raise FrameError(UNEXPECTED_FRAME, f"body frame on channel {number}")
        remaining -= size
        if remaining > 0:
            self.remaining[number] = remaining
            return
        del self.remaining[number]
        if remaining < 0:
            raise FrameError(FRAME_ERROR, "body longer than its header announced")

    def forget(self, number: int) -> None:
        """Channel ``number`` is closed."""
        self.expect_header.discard(number)
        self.remaining.pop(number, None)


class Out:
    """Forwarded bytes of one direction: runs of the input buffer plus frames
    the gateway adds, in order."""

    __slots__ = ("buf", "end", "parts", "start")

    def __init__(self, parts: list[Chunk]) -> None:
        self.parts = parts
        self.buf: bytes | None = None
        self.start = self.end = 0

    def collect(self, parts: list[Chunk]) -> None:
        """Collect into ``parts`` from now on (a new call into the engine)."""
        self.parts = parts
        self.buf = None

    def keep(self, buf: bytes, start: int, end: int) -> None:
        if self.buf is buf and self.end == start:
            self.end = end
            return
        self.flush()
        self.buf, self.start, self.end = buf, start, end

    def flush(self) -> None:
        buf = self.buf
        if buf is not None:
            start, end = self.start, self.end
            if start == 0 and end == len(buf):
                self.parts.append(buf)
            elif end - start >= VIEW_MIN:
                self.parts.append(memoryview(buf)[start:end])
            else:
                self.parts.append(buf[start:end])
            self.buf = None

    def add(self, frame: bytes) -> None:
        self.flush()
        self.parts.append(frame)


def _frame_on(buf: bytes, pos: int, kind: int, number: int) -> int:
    """The size of the frame at ``buf[pos]`` when it is of type ``kind`` on
    channel ``number``; -1 otherwise."""
    if buf[pos] != kind or u16(buf, pos + 1) != number:
        return -1
    return u32(buf, pos + 3)


def content_unit(buf: bytes, end: int, number: int, max_frame: int) -> tuple[int, int]:
    """(header end, message end) when the content method frame ending at
    ``end`` is followed in ``buf`` by its header and one body frame holding the
    whole non-empty body, all on channel ``number``; (-1, n) when ``buf``
    ends before that can be told or before the body ends, and must hold ``n``
    bytes to go on; (0, 0) otherwise (the frame-by-frame path then judges
    what is there)."""
    size_all = len(buf)
    if end + 7 > size_all:
        return -1, end + 7
    size = _frame_on(buf, end, 2, number)
    if size < 14 or size > max_frame:
        return 0, 0
    header_end = end + size + 8
    if header_end > size_all:
        return -1, header_end
    declared = u64(buf, end + 11)  # the header's body size
    if declared == 0:  # no body frame follows: the message is complete
        return 0, 0
    if header_end + 7 > size_all:
        return -1, header_end + 7
    body_size = _frame_on(buf, header_end, 3, number)
    unit_end = header_end + body_size + 8
    if (
        body_size <= 0
        or body_size > max_frame
        or buf[header_end - 1] != 0xCE
        or declared != body_size
    ):
        return 0, 0
    if unit_end > size_all:
        return -1, unit_end
    if buf[unit_end - 1] != 0xCE:
        return 0, 0
    return header_end, unit_end
