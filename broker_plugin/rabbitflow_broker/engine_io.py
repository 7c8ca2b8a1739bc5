"""The connection engine's interface types (pure): what it needs from the
gateway (:class:`Hub`), its limits (:class:`EngineSettings`), what it asks
the driver to do (:class:`Actions`), and its byte buffers."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rabbitflow_broker.confirms import Route
from rabbitflow_broker.events import Event

__all__ = ["Actions", "EngineSettings", "Hub", "Inbound", "Out", "content_unit"]


class Hub(Protocol):
    """The shared gateway state one connection may use (narrow on purpose)."""

    #: True while nothing blocks any producer (no queue ON, no administrator
    #: stop, no vhost-wide block): the per-message blocking checks are skipped.
    calm: bool

    def published(self, vhost: str, route: Route, size: int) -> None: ...
    def removed(self, vhost: str, queue: str, messages: int, size: int) -> None: ...
    def persistent_published(self, vhost: str, size: int) -> None: ...
    def route_blocker(self, vhost: str) -> Callable[[Route], bool]: ...
    def blockers(self, vhost: str, route: Route) -> list[str]: ...
    def blocker_active(self, vhost: str, blocker: str) -> bool: ...
    def vhost_blocked(self, vhost: str) -> bool: ...
    def route(self, vhost: str, exchange: str, key: str, headers: Any) -> Route: ...
    def validate_declare(self, arguments: Mapping[str, object] | None) -> None: ...
    def confirmed(
        self, vhost: str, request: int, args: list[object], reply: Any, last: str
    ) -> None: ...
    def now(self) -> Any: ...
    def monotonic(self) -> float: ...

    @property
    def store_quota_on(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Per-connection limits, from the gateway's configuration."""

    flow_enforcement_timeout: float | None = 5.0  # seconds; None: never close
    handshake_timeout: float | None = 10.0


@dataclass(slots=True)
class Actions:
    """What the driver must do after a call into the engine, in this order."""

    to_upstream: list[bytes] = field(default_factory=list)
    to_client: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    read_client: bool = True
    timer: float | None = None  # monotonic time to call tick() at
    close: bool = False  # flush what is above, then close both sockets


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


class Out:
    """Forwarded bytes of one direction: runs of the input buffer plus frames
    the gateway adds, in order."""

    __slots__ = ("buf", "end", "parts", "start")

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.buf: bytes | bytearray | None = None
        self.start = self.end = 0

    def collect(self, parts: list[bytes]) -> None:
        """Collect into ``parts`` from now on (a new call into the engine)."""
        self.parts = parts
        self.buf = None

    def keep(self, buf: bytes | bytearray, start: int, end: int) -> None:
        if self.buf is buf and self.end == start:
            self.end = end
            return
        self.flush()
        self.buf, self.start, self.end = buf, start, end

    def flush(self) -> None:
        buf = self.buf
        if buf is not None:
            if isinstance(buf, bytes):
                whole = self.start == 0 and self.end == len(buf)
                self.parts.append(buf if whole else buf[self.start : self.end])
            else:
                self.parts.append(bytes(memoryview(buf)[self.start : self.end]))
            self.buf = None

    def add(self, frame: bytes) -> None:
        self.flush()
        self.parts.append(frame)


_FRAME = struct.Struct(">BHI")
_U64 = struct.Struct(">Q")


def content_unit(buf: bytes | bytearray, end: int, number: int, max_frame: int) -> tuple[int, int]:
    """(header end, message end) when the content method frame ending at
    ``end`` is followed in ``buf`` by its header and one body frame holding the
    whole non-empty body, all on channel ``number``; (0, 0) otherwise (the
    frame-by-frame path then judges what is there)."""
    size_all = len(buf)
    if end + 7 > size_all:
        return 0, 0
    kind, channel, size = _FRAME.unpack_from(buf, end)
    header_end: int = end + size + 8
    if kind != 2 or channel != number or size < 14 or header_end + 7 > size_all:
        return 0, 0
    kind, channel, body_size = _FRAME.unpack_from(buf, header_end)
    unit_end: int = header_end + body_size + 8
    if (
        kind != 3
        or channel != number
        or unit_end > size_all
        or body_size == 0
        or size > max_frame
        or body_size > max_frame
        or buf[header_end - 1] != 0xCE
        or buf[unit_end - 1] != 0xCE
        or _U64.unpack_from(buf, end + 11)[0] != body_size
    ):
        return 0, 0
    return header_end, unit_end
