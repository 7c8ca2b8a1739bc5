"""One client connection and its upstream connection, as a pure engine (sans-IO).

The driver (:mod:`~rabbitflow_broker.relay`) feeds the engine bytes from
either socket plus the monotonic clock and carries out the
:class:`Actions` it returns: bytes for each side, events to log, whether to
read the client socket, when to call :meth:`Engine.tick` again, and when to
close.  Like h11, the engine imports no asyncio and no socket, reads no
clock and never calls into another connection; the shared gateway state is
reached only through :class:`Hub`.

Hot path: each direction keeps one byte buffer with a read position;
frames are scanned in place, a publish (method, header, body) and a
delivery are handled as one unit, and the original bytes go out as runs of
the received buffer (the whole read when nothing was dropped or added).
Only the fields a decision needs are decoded (:mod:`~rabbitflow_broker.amqp`).

A frame the engine cannot interpret (bad framing, malformed arguments, a
method on a channel the gateway does not know) is forwarded to RabbitMQ
unchanged and the rest of the client's bytes pass through uninterpreted:
RabbitMQ closes the connection with its own reply code, which the client
receives.  The gateway's own limits close the connection itself
(:data:`PRE_LOGIN_FRAME_MAX`, :data:`PRE_LOGIN_BUFFER`, the handshake timeout).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from rabbitflow_broker import amqp
from rabbitflow_broker.amqp import CONTENT_METHODS, content_properties, decode_args, text
from rabbitflow_broker.confirms import Route
from rabbitflow_broker.engine_channel import Channel
from rabbitflow_broker.events import ConnectionClosed, Event
from rabbitflow_broker.frames import FRAME_ERROR, PROTOCOL_HEADER, UNEXPECTED_FRAME, FrameError
from rabbitflow_broker.gateway import BlockedChannel

__all__ = [
    "PAUSE_BYTES",
    "PAUSE_MESSAGES",
    "PRE_LOGIN_BUFFER",
    "PRE_LOGIN_FRAME_MAX",
    "Actions",
    "Engine",
    "EngineSettings",
    "Hub",
]

#: Frames larger than AMQP's frame-min-size are refused before Tune-Ok.
PRE_LOGIN_FRAME_MAX: Final = 4096
#: Bytes a connection may have buffered before RabbitMQ accepted its login.
PRE_LOGIN_BUFFER: Final = 64 * 1024
#: Messages / body bytes a connection may publish on flowed channels
#: (summed over its channels) before its reads are paused.
PAUSE_MESSAGES: Final = 2000
PAUSE_BYTES: Final = 1024 * 1024
#: A connection that ignores flow this soon after a CHN-1012 is closed.
REPEAT_OFFENCE_S: Final = 60.0
#: How long to wait for the client's Close-Ok before closing the socket.
CLOSE_GRACE_S: Final = 1.0

_FRAME = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_METHOD, _HEADER, _BODY, _HEARTBEAT = 1, 2, 3, 8
_CLOSE_OK = amqp.CONNECTION_CLOSE_OK_FRAME


class Hub(Protocol):
    """The shared gateway state one connection may use (narrow on purpose)."""

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


class _Inbound:
    """One direction's byte buffer: scanned in place, compacted only when a
    frame is left incomplete."""

    __slots__ = ("expect_header", "max_frame", "need", "pending", "remaining")

    def __init__(self, max_frame: int) -> None:
        self.pending = bytearray()
        self.need = 0  # bytes ``pending`` must hold before a scan can progress
        self.max_frame = max_frame
        self.expect_header: set[int] = set()  # channels between content method and header
        self.remaining: dict[int, int] = {}  # channel -> body bytes still due


class _Out:
    """Forwarded bytes of one direction: runs of the input buffer plus frames
    the gateway adds, in order."""

    __slots__ = ("buf", "end", "parts", "start")

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.buf: bytes | bytearray | None = None
        self.start = self.end = 0

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


class Engine:
    """The state machine of one relayed connection."""

    def __init__(
        self,
        hub: Hub,
        *,
        number: int,
        remote_host: str = "?",
        remote_port: int = 0,
        settings: EngineSettings | None = None,
    ) -> None:
        self.hub = hub
        self.number = number
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.user = "unknown"
        self.vhost = "/"
        self.settings = settings or EngineSettings()
        self.channels: dict[int, Channel] = {}
        # Channels the gateway closed upstream, awaiting RabbitMQ's CloseOk:
        # frames of a client that reopens the number meanwhile wait here.
        self.upstream_closing: dict[int, list[bytes]] = {}
        self._client = _Inbound(PRE_LOGIN_FRAME_MAX)
        self._upstream = _Inbound(1 << 31)
        self._header_seen = False
        self._upstream_ready = False
        self._logged_in = False  # RabbitMQ sent Tune: it accepted the login
        self._tuned = False  # the client sent Tune-Ok
        self._open = False  # Open-Ok went to the client
        self._passthrough = False  # client bytes RabbitMQ is about to refuse
        self._closing_at: float | None = None
        self._closed = False
        self._stop_after: int | None = None  # channel whose message ends the parse
        self._flow_paused = False
        self._blocked_capable = False
        self._started: float | None = None
        # Back-pressure allowance, per connection (summed over its channels).
        self.flowed_messages = 0
        self.flowed_bytes = 0
        self.last_ignored: float | None = None
        self._deferred: list[tuple[int, bytes]] = []
        self._acts = Actions()
        self._up = _Out(self._acts.to_upstream)
        self._down = _Out(self._acts.to_client)
        self.now = 0.0

    # -- driver interface ----------------------------------------------------

    def start(self, now: float) -> Actions:
        """The client connected: start the handshake clock."""
        self._begin(now)
        self._started = now
        return self._finish()

    def upstream_connected(self, now: float) -> Actions:
        """The upstream socket is open: relay what the client sent meanwhile."""
        self._begin(now)
        self._upstream_ready = True
        self._parse_client(b"")
        return self._finish()

    def upstream_failed(self, now: float, cause: str) -> Actions:
        """The upstream connection could not be opened: tell the client why."""
        self._begin(now)
        self.close_connection(amqp.CONNECTION_FORCED, cause)
        return self._finish()

    def receive_client(self, data: bytes, now: float) -> Actions:
        """Bytes from the client socket."""
        self._begin(now)
        if self._closing_at is not None:
            if _CLOSE_OK in data:  # the client answered the gateway's Connection.Close
                self._closed = True
        elif self._passthrough:
            self._up.add(data)
        elif not self._closed:
            self._parse_client(data)
        return self._finish()

    def receive_upstream(self, data: bytes, now: float) -> Actions:
        """Bytes from the upstream socket."""
        self._begin(now)
        if not self._closed:
            try:
                self._parse_upstream(data)
            except FrameError as exc:
                self._down.add(amqp.close_frame(0, amqp.INTERNAL_ERROR, f"upstream: {exc.text}"))
                self._closed = True
        return self._finish()

    def tick(self, now: float) -> Actions:
        """The timer the last :class:`Actions` asked for (or any later time)."""
        self._begin(now)
        if self._closing_at is not None and now >= self._closing_at:
            self._closed = True
        elif not self._open and self._started is not None and self._handshake_expired(now):
            self.close_connection(FRAME_ERROR, "handshake timeout")
        else:
            self._resume_if_allowed()
        return self._finish()

    def refresh(self, now: float) -> Actions:
        """The gateway's blocking state changed: release held confirms, unflow channels."""
        self._begin(now)
        if not self._closed and self._closing_at is None:
            self._refresh_channels()
            self._resume_if_allowed()
        return self._finish()

    def close_connection(self, code: int, text_: str, *, wait: bool = True) -> None:
        """Send the client Connection.Close; close the sockets once it answers
        (or after :data:`CLOSE_GRACE_S`), or at once without ``wait``."""
        if self._closing_at is not None or self._closed:
            return
        self._down.add(amqp.close_frame(0, code, amqp.reply_text(code, text_)))
        if self._upstream_ready and self._logged_in:
            self._up.add(amqp.close_frame(0, 200, "client connection closed by the gateway"))
        self._closing_at = self.now + CLOSE_GRACE_S
        self._closed = not wait

    def shutdown(self, now: float, text_: str) -> Actions:
        """Close the client with 320 and ``text_`` (the driver drained first)."""
        self._begin(now)
        self.close_connection(amqp.CONNECTION_FORCED, text_)
        return self._finish()

    def client_gone(self, now: float) -> Actions:
        """The client socket closed: log the connection's end."""
        self._begin(now)
        if not self._closed:
            self._closed = True
            for channel in list(self.channels.values()):
                self.forget_channel(channel.number)
            if self._open:
                self._acts.events.append(ConnectionClosed(ts=self.hub.now(), **self.identity()))
        return self._finish()

    @property
    def in_flight(self) -> int:
        """Publishes whose confirm or commit-ok the client still waits for."""
        return sum(channel.in_flight for channel in self.channels.values())

    # -- actions ---------------------------------------------------------------

    def _begin(self, now: float) -> None:
        self.now = now
        acts = self._acts = Actions()
        self._up = _Out(acts.to_upstream)
        self._down = _Out(acts.to_client)

    def _finish(self) -> Actions:
        self._up.flush()
        self._down.flush()
        acts = self._acts
        acts.close = self._closed
        acts.read_client = self._reading()
        acts.timer = self._next_timer()
        return acts

    def _reading(self) -> bool:
        if self._closed or self._closing_at is not None:
            return False
        if not self._upstream_ready:
            return len(self._client.pending) < PRE_LOGIN_BUFFER
        return not self._flow_paused

    def _handshake_expired(self, now: float) -> bool:
        timeout = self.settings.handshake_timeout
        return timeout is not None and self._started is not None and now >= self._started + timeout

    def _next_timer(self) -> float | None:
        if self._closed:
            return None
        if self._closing_at is not None:
            return self._closing_at
        deadlines = []
        timeout = self.settings.handshake_timeout
        if not self._open and timeout is not None and self._started is not None:
            deadlines.append(self._started + timeout)
        if self._flow_paused:
            until = self.pause_until()
            if until is not None and until != float("inf"):
                deadlines.append(until)
        return min(deadlines) if deadlines else None

    def send_client(self, channel: int, frame: bytes) -> None:
        """A frame of the gateway's own for the client, never inside a delivery
        on that channel and never ahead of an earlier one for it."""
        if (
            channel in self._upstream.remaining
            or channel in self._upstream.expect_header
            or (self._deferred and any(number == channel for number, _ in self._deferred))
        ):
            self._deferred.append((channel, frame))
        else:
            self._down.add(frame)

    def send_upstream(self, frame: bytes) -> None:
        """A frame of the gateway's own for RabbitMQ, after what was read so far."""
        self._up.add(frame)

    def emit(self, event: Event) -> None:
        """An event for the driver to log."""
        self._acts.events.append(event)

    def identity(self) -> dict[str, Any]:
        """Fields every connection and channel event carries."""
        return {
            "vhost": self.vhost,
            "connection": self.number,
            "user": self.user,
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
        }

    # -- client -> upstream ------------------------------------------------------

    def _parse_client(self, data: bytes) -> None:
        inbound = self._client
        pending = inbound.pending
        if pending:
            pending += data
            if len(pending) < inbound.need or not self._upstream_ready:
                self._check_pre_login()
                return
            buf: bytes | bytearray = pending
        else:
            buf = data
        if not self._upstream_ready:
            pending += data
            self._check_pre_login()
            return
        pos = 0
        if not self._header_seen:
            pos = self._protocol_header(buf)
            if pos < 0:
                return
        try:
            pos = self._scan_client(buf, pos)
        except FrameError as exc:
            self._protocol_error(exc)
            return
        if self._passthrough:
            self._up.add(bytes(buf[pos:]))
            pos = len(buf)
        self._up.flush()  # before the buffer it points into is compacted
        if buf is pending:
            del pending[:pos]
        else:
            pending += buf[pos:]
        self._check_pre_login()

    def _check_pre_login(self) -> None:
        if not self._logged_in and len(self._client.pending) > PRE_LOGIN_BUFFER:
            self._client.pending.clear()
            self.close_connection(FRAME_ERROR, f"more than {PRE_LOGIN_BUFFER} bytes before login")

    def _protocol_header(self, buf: bytes | bytearray) -> int:
        have = min(len(buf), 8)
        if bytes(buf[:have]) != PROTOCOL_HEADER[:have]:
            # RabbitMQ answers a bad header with its own and closes.
            self._down.add(PROTOCOL_HEADER)
            self._client.pending.clear()
            self._closed = True
            return -1
        if have < 8:
            if buf is not self._client.pending:
                self._client.pending += buf
            self._client.need = 8
            return -1
        self._header_seen = True
        self._up.keep(buf, 0, 8)
        return 8

    def _scan_client(self, buf: bytes | bytearray, pos: int) -> int:
        """Handle the complete frames of ``buf`` from ``pos``; returns where it stopped."""
        inbound = self._client
        size_all = len(buf)
        unpack = _FRAME.unpack_from
        channels = self.channels
        up = self._up
        while size_all - pos >= 7:
            kind, number, size = unpack(buf, pos)
            end = pos + size + 8
            if size > inbound.max_frame:
                if not self._tuned:
                    raise FrameError(FRAME_ERROR, f"frame of {size} bytes before tune-ok")
                self._refuse(FRAME_ERROR, f"frame of {size} bytes exceeds frame-max")
                return pos
            if end > size_all:
                inbound.need = end - pos
                return pos
            if buf[end - 1] != 0xCE:
                self._refuse(FRAME_ERROR, "frame does not end with 0xCE")
                return pos
            channel = channels.get(number) if number else None
            if kind == _METHOD and size >= 4:
                method = _U32.unpack_from(buf, pos + 7)[0]
                if (
                    method == amqp.BASIC_PUBLISH
                    and channel is not None
                    and not channel.blockers
                    and not channel.closed_by_gateway
                    and number not in self.upstream_closing
                ):
                    unit_end = self._publish_unit(channel, buf, pos, end, size_all)
                    if unit_end:
                        up.keep(buf, pos, unit_end)
                        pos = unit_end
                        if self._stop_after is not None:
                            break
                        continue
            keep = self._client_frame(buf, pos, end, kind=kind, number=number, channel=channel)
            if self._passthrough:
                return pos
            if keep:
                stash = self.upstream_closing.get(number) if number else None
                if stash is None:
                    up.keep(buf, pos, end)
                else:
                    stash.append(bytes(buf[pos:end]))
            pos = end
            if self._stop_after is not None and not self._mid_content(inbound, self._stop_after):
                break
        self._stop_after = None
        inbound.need = 7
        return pos

    def _publish_unit(
        self, channel: Channel, buf: bytes | bytearray, pos: int, end: int, size_all: int
    ) -> int:
        """A whole publish (method, header, one body frame) in ``buf``: account
        for it at once and return where it ends; 0 for the frame-by-frame path."""
        if end + 7 > size_all or channel.number in self._client.expect_header:
            return 0
        kind, number, size = _FRAME.unpack_from(buf, end)
        header_end = end + size + 8
        if kind != _HEADER or number != channel.number or header_end + 7 > size_all or size < 14:
            return 0
        body_kind, body_number, body_size = _FRAME.unpack_from(buf, header_end)
        unit_end: int = header_end + body_size + 8
        if (
            body_kind != _BODY
            or body_number != channel.number
            or unit_end > size_all
            or buf[end - 1] != 0xCE
            or buf[header_end - 1] != 0xCE
            or buf[unit_end - 1] != 0xCE
            or body_size > self._client.max_frame
        ):
            return 0
        (announced,) = _U64.unpack_from(buf, end + 11)
        if announced != body_size or body_size == 0:
            return 0
        try:
            channel.start_publish(bytes(buf[pos + 7 : end - 1]))
            info = content_properties(bytes(buf[end + 7 : header_end - 1]))
        except FrameError:
            channel.publish = None
            return 0
        channel.published(info)
        return unit_end

    @staticmethod
    def _mid_content(inbound: _Inbound, number: int) -> bool:
        return number in inbound.expect_header or number in inbound.remaining

    def _client_frame(
        self,
        buf: bytes | bytearray,
        pos: int,
        end: int,
        *,
        kind: int,
        number: int,
        channel: Channel | None,
    ) -> bool:
        """One client frame; True to forward it."""
        inbound = self._client
        if kind == _BODY:
            remaining = inbound.remaining.get(number)
            if remaining is None or number == 0:
                return self._refuse(UNEXPECTED_FRAME, f"body frame on channel {number}")
            remaining -= end - pos - 8
            if remaining > 0:
                inbound.remaining[number] = remaining
            else:
                del inbound.remaining[number]
                if remaining < 0:
                    return self._refuse(FRAME_ERROR, "body longer than its header announced")
            return channel is None or channel.keep_content()
        if kind == _HEADER:
            if number not in inbound.expect_header:
                return self._refuse(UNEXPECTED_FRAME, f"content header on channel {number}")
            inbound.expect_header.discard(number)
            try:
                info = content_properties(bytes(buf[pos + 7 : end - 1]))
            except FrameError as exc:
                return self._refuse(exc.code, exc.text)
            if info.body_size:
                inbound.remaining[number] = info.body_size
            if channel is not None and channel.publish is not None:
                channel.published(info)
            return channel is None or channel.keep_content()
        if kind == _HEARTBEAT:
            return True if number == 0 else self._refuse(FRAME_ERROR, "heartbeat on a channel")
        if kind != _METHOD or end - pos < 12:
            return self._refuse(FRAME_ERROR, f"bad frame of type {kind} and size {end - pos - 8}")
        method = _U32.unpack_from(buf, pos + 7)[0]
        if number in inbound.expect_header or number in inbound.remaining:
            return self._refuse(UNEXPECTED_FRAME, f"method frame on channel {number} mid-content")
        if method in CONTENT_METHODS:
            inbound.expect_header.add(number)
        payload = bytes(buf[pos + 7 : end - 1])
        try:
            if number == 0:
                return self._connection_method(method, payload)
            if channel is None:
                if method != amqp.CHANNEL_OPEN:
                    return self._refuse(amqp.CHANNEL_ERROR, "expected 'channel.open'")
                self.channels[number] = Channel(self, number)
                return True
            return channel.client_method(method, payload)
        except FrameError as exc:
            return self._refuse(exc.code, exc.text)

    def _connection_method(self, method: int, payload: bytes) -> bool:
        if method == amqp.CONNECTION_START_OK:
            self.user, self._blocked_capable = amqp.start_ok_user(payload)
        elif method == amqp.CONNECTION_TUNE_OK:
            frame_max = int(decode_args(method, payload)[1])  # type: ignore[call-overload]
            limit = frame_max or 1 << 31
            self._client.max_frame = limit
            self._upstream.max_frame = limit
            self._tuned = True
        elif method == amqp.CONNECTION_OPEN:
            self.vhost = text(decode_args(method, payload)[0]) or "/"
        elif method >> 16 != 10:
            return self._refuse(amqp.CHANNEL_ERROR, f"{amqp.method_name(method)} on channel 0")
        return True

    def _refuse(self, code: int, reason: str) -> bool:
        """A frame the gateway cannot follow.  Once the connection is open,
        RabbitMQ judges it: it and everything after go upstream unread, and
        RabbitMQ closes with its own code.  Before that, RabbitMQ would drop
        the socket without a word, so the gateway closes with ``code``.

        Raises:
            FrameError: before the connection is open.
        """
        if not self._open:
            raise FrameError(code, reason)
        self._passthrough = True
        return False

    def _protocol_error(self, exc: FrameError) -> None:
        self._client.pending.clear()
        self.close_connection(exc.code, exc.text, wait=False)

    # -- upstream -> client ------------------------------------------------------

    def _parse_upstream(self, data: bytes) -> None:
        inbound = self._upstream
        pending = inbound.pending
        if pending:
            pending += data
            if len(pending) < inbound.need:
                return
            buf: bytes | bytearray = pending
        else:
            buf = data
        pos = self._scan_upstream(buf)
        self._down.flush()  # before the buffer it points into is compacted
        if buf is pending:
            del pending[:pos]
        else:
            pending += buf[pos:]
        if self._deferred:
            self._flush_deferred()

    def _scan_upstream(self, buf: bytes | bytearray) -> int:
        inbound = self._upstream
        size_all = len(buf)
        pos = 0
        unpack = _FRAME.unpack_from
        channels = self.channels
        down = self._down
        while size_all - pos >= 7:
            kind, number, size = unpack(buf, pos)
            if size > inbound.max_frame:
                raise FrameError(FRAME_ERROR, f"frame of {size} bytes exceeds frame-max")
            end = pos + size + 8
            if end > size_all:
                inbound.need = end - pos
                return pos
            if buf[end - 1] != 0xCE:
                raise FrameError(FRAME_ERROR, "frame does not end with 0xCE")
            channel = channels.get(number) if number else None
            if kind == _METHOD and channel is not None and size >= 4:
                method = _U32.unpack_from(buf, pos + 7)[0]
                if method == amqp.BASIC_DELIVER and number not in self.upstream_closing:
                    unit_end = self._delivery_unit(channel, buf, pos, end, size_all)
                    if unit_end:
                        down.keep(buf, pos, unit_end)
                        pos = unit_end
                        continue
            if self._upstream_frame(buf, pos, end, kind=kind, number=number, channel=channel):
                down.keep(buf, pos, end)
            pos = end
        inbound.need = 7
        return pos

    def _delivery_unit(
        self, channel: Channel, buf: bytes | bytearray, pos: int, end: int, size_all: int
    ) -> int:
        number = channel.number
        if end + 7 > size_all or number in self._upstream.expect_header:
            return 0
        kind, header_no, size = _FRAME.unpack_from(buf, end)
        header_end = end + size + 8
        if kind != _HEADER or header_no != number or header_end + 7 > size_all or size < 14:
            return 0
        body_kind, body_no, body_size = _FRAME.unpack_from(buf, header_end)
        unit_end: int = header_end + body_size + 8
        if body_kind != _BODY or body_no != number or unit_end > size_all:
            return 0
        (announced,) = _U64.unpack_from(buf, end + 11)
        if announced != body_size or body_size == 0 or buf[unit_end - 1] != 0xCE:
            return 0
        channel.deliver(bytes(buf[pos + 7 : end - 1]))
        channel.delivered(body_size)
        return unit_end

    def _upstream_frame(
        self,
        buf: bytes | bytearray,
        pos: int,
        end: int,
        *,
        kind: int,
        number: int,
        channel: Channel | None,
    ) -> bool:
        """One frame from RabbitMQ; True to forward it to the client."""
        inbound = self._upstream
        closing = number in self.upstream_closing
        if kind == _BODY:
            remaining = inbound.remaining.get(number, 0) - (end - pos - 8)
            if remaining > 0:
                inbound.remaining[number] = remaining
            else:
                inbound.remaining.pop(number, None)
            return not closing
        if kind == _HEADER:
            inbound.expect_header.discard(number)
            body_size = _U64.unpack_from(buf, pos + 11)[0] if end - pos >= 19 else 0
            if body_size:
                inbound.remaining[number] = body_size
            if closing:
                return False
            if channel is not None:
                channel.delivered(body_size)
            return True
        if kind != _METHOD or end - pos < 12:
            return not closing
        method = _U32.unpack_from(buf, pos + 7)[0]
        inbound.remaining.pop(number, None)
        inbound.expect_header.discard(number)
        if method in CONTENT_METHODS:
            inbound.expect_header.add(number)
        if closing:
            # Swallow what RabbitMQ still sends on a channel the gateway closed.
            if method == amqp.CHANNEL_CLOSE_OK:
                stash = self.upstream_closing.pop(number)
                if stash:
                    self._up.add(b"".join(stash))
            return False
        if number == 0:
            if method == amqp.CONNECTION_TUNE:
                self._logged_in = True
            elif method == amqp.CONNECTION_OPEN_OK:
                self._open = True
            elif method == amqp.CONNECTION_CLOSE:
                self._passthrough = True  # the client's Close-Ok goes to RabbitMQ
            return True
        if channel is None:
            return True
        return channel.upstream_method(method, bytes(buf[pos + 7 : end - 1]))

    def _flush_deferred(self) -> None:
        inbound = self._upstream
        ready = [
            (n, f)
            for n, f in self._deferred
            if n not in inbound.remaining and n not in inbound.expect_header
        ]
        if ready:
            self._deferred = [d for d in self._deferred if d not in ready]
            for _, frame in ready:
                self._down.add(frame)

    # -- flow control across channels -------------------------------------------

    def _refresh_channels(self) -> None:
        hub = self.hub
        blocked = hub.route_blocker(self.vhost)
        vhost_blocked = hub.vhost_blocked(self.vhost)
        for channel in list(self.channels.values()):
            channel.refresh(blocked, vhost_blocked)
        if not any(channel.blockers for channel in self.channels.values()):
            self.flowed_messages = self.flowed_bytes = 0

    def counted_while_flowed(self, number: int, size: int) -> None:
        """A publish on a flowed channel: stop parsing after it when the
        connection is past its allowance."""
        self.flowed_messages += 1
        self.flowed_bytes += size
        if self.flowed_messages > PAUSE_MESSAGES or self.flowed_bytes > PAUSE_BYTES:
            until = self.pause_until()
            if until is not None and until > self.now:
                self._stop_after = number
                if not self._flow_paused:
                    self._flow_paused = True
                    if self._blocked_capable:
                        self.send_client(0, amqp.connection_blocked("flow control"))

    def pause_until(self) -> float | None:
        """When a paused connection may be read again (inf: once unflowed)."""
        timeout = self.settings.flow_enforcement_timeout
        flowed = [
            c.flowed_at
            for c in self.channels.values()
            if c.blockers and c.flowed_at is not None and not c.closed_by_gateway
        ]
        if not flowed:
            return None
        if timeout is None:
            return float("inf")
        # Just past the timeout, so the next publish is judged ignoring flow.
        return max(flowed) + timeout + 0.001

    def _resume_if_allowed(self) -> None:
        if not self._flow_paused:
            if self._client.pending and self._upstream_ready:
                self._parse_client(b"")
            return
        until = self.pause_until()
        over = self.flowed_messages > PAUSE_MESSAGES or self.flowed_bytes > PAUSE_BYTES
        if until is not None and over and until > self.now:
            return
        self._flow_paused = False
        if self._blocked_capable:
            self.send_client(0, amqp.CONNECTION_UNBLOCKED_FRAME)
        self._parse_client(b"")

    def flow_ignored(self, channel: Channel) -> bool:
        """True (and the channel or connection closed) when ``channel`` publishes
        past its enforcement timeout."""
        timeout = self.settings.flow_enforcement_timeout
        if (
            not channel.blockers
            or channel.flowed_at is None
            or timeout is None
            or self.now - channel.flowed_at <= timeout
        ):
            return False
        repeat = self.last_ignored is not None and self.now - self.last_ignored <= REPEAT_OFFENCE_S
        self.last_ignored = self.now
        self.emit(channel.event_ignored())
        if repeat:
            self._passthrough = False
            self.close_connection(
                amqp.PRECONDITION_FAILED,
                f"flow control ignored again within {REPEAT_OFFENCE_S:.0f} s of a channel close",
            )
            self._stop_after = channel.number
            return True
        channel.close(
            amqp.PRECONDITION_FAILED,
            f"flow control ignored: still publishing {timeout * 1000:.0f} ms after "
            "Channel.Flow(active=false)",
            amqp.BASIC_PUBLISH,
        )
        return True

    def forget_channel(self, number: int) -> None:
        """The channel is closed on both sides."""
        channel = self.channels.pop(number, None)
        self._client.expect_header.discard(number)
        self._client.remaining.pop(number, None)
        self._deferred = [(n, f) for n, f in self._deferred if n != number]
        if channel is not None and channel.ever_flowed:
            self.emit(channel.event_closed())

    # -- views ---------------------------------------------------------------------

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        """Channels of this connection currently flowed."""
        for channel in self.channels.values():
            if channel.blockers:
                yield BlockedChannel(
                    connection=self.number,
                    channel=channel.number,
                    user=self.user,
                    remote=f"{self.remote_host}:{self.remote_port}",
                    vhost=self.vhost,
                    blocked_on=tuple(channel.blockers),
                )

    def held_confirms(self) -> int:
        """Confirms and commit-oks currently held from the client."""
        return sum(channel.held for channel in self.channels.values())

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        """Admin API view of this connection's channels."""
        remote = f"{self.remote_host}:{self.remote_port}"
        for channel in self.channels.values():
            yield {
                "connection": self.number,
                "channel": channel.number,
                "user": self.user,
                "remote": remote,
                "vhost": self.vhost,
                **channel.describe(),
            }
