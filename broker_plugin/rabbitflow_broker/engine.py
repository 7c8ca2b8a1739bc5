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

from collections.abc import Callable
from typing import Any, Final

from rabbitflow_broker import amqp, engine_frames, engine_pause
from rabbitflow_broker.amqp import (
    content_properties,
    u16,
    u32,
    u64,
)
from rabbitflow_broker.confirms import Route
from rabbitflow_broker.engine_channel import Channel, Connection
from rabbitflow_broker.engine_flow import (
    PAUSE_BYTES,
    PAUSE_MESSAGES,
    Allowance,
)
from rabbitflow_broker.engine_io import Actions, EngineSettings, Hub, Inbound, Out, content_unit
from rabbitflow_broker.engine_upstream import FromUpstream
from rabbitflow_broker.events import ConnectionClosed, Event
from rabbitflow_broker.frames import FRAME_ERROR, PROTOCOL_HEADER, FrameError

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
#: How long to wait for the client's Close-Ok before closing the socket.
CLOSE_GRACE_S: Final = 1.0

_METHOD: Final = 1
_CLOSE_OK = amqp.CONNECTION_CLOSE_OK_FRAME
# What a scan of the pending buffer left (Engine._scan_pending).
_USED: Final = 0
_WAIT: Final = 1
_STOP: Final = 2


class Engine(Connection):
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
        # Each channel refers back to the engine (it calls into it on every
        # frame): a cycle that release() breaks when the connection ends.
        self.channels: dict[int, Channel] = {}
        # Channels the gateway closed upstream, awaiting RabbitMQ's CloseOk:
        # frames of a client that reopens the number meanwhile wait here.
        self.upstream_closing: dict[int, list[bytes]] = {}
        self._client = Inbound(PRE_LOGIN_FRAME_MAX)
        self._from_upstream = FromUpstream()
        self._upstream = self._from_upstream.inbound
        self._header_seen = False
        self._upstream_ready = False
        self._logged_in = False  # RabbitMQ sent Tune: it accepted the login
        self._tuned = False  # the client sent Tune-Ok
        self._open = False  # Open-Ok went to the client
        self._passthrough = False  # client bytes RabbitMQ is about to refuse
        self._closing_at: float | None = None
        self._closed = False
        self._stop_after: int | None = None  # channel whose message ends the parse
        self._halted = False  # the last scan stopped at a channel's message end
        self._flow_paused = False
        self._blocked_capable = False
        self._started: float | None = None
        self.allowance = Allowance(self.settings.flow_enforcement_timeout)
        #: Whether a route is blocked, as of the last refresh (a hint: blocking
        #: itself is decided by the hub; refresh() renews it on every change).
        self.route_blocked: Callable[[Route], bool] = hub.route_blocker(self.vhost)
        self._acts = Actions()
        self._up = Out(self._acts.to_upstream)
        self._down = Out(self._acts.to_client)
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
        self.parse_client(b"")
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
            pending = self._client.pending
            if pending:  # what waited for more goes first: RabbitMQ judges it all
                self._up.add(bytes(pending))
                pending.clear()
            self._up.add(data)
        elif not self._closed:
            self.parse_client(data)
        return self._finish()

    def receive_upstream(self, data: bytes, now: float) -> Actions:
        """Bytes from the upstream socket."""
        self._begin(now)
        if not self._closed:
            try:
                self._from_upstream.receive(self, data, self._down, self._up)
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
            self.close_connection(amqp.CONNECTION_FORCED, "handshake timeout")
        else:
            engine_pause.resume_if_allowed(self)
        return self._finish()

    def refresh(self, now: float) -> Actions:
        """The gateway's blocking state changed: release held confirms, unflow channels."""
        self._begin(now)
        if not self._closed and self._closing_at is None:
            engine_pause.refresh_channels(self)
            engine_pause.resume_if_allowed(self)
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

    def release(self) -> None:
        """The driver is done with the connection (after :meth:`client_gone`):
        drop the channels, whose back-reference to the engine is the engine's
        only reference cycle, so that reference counting frees it at once."""
        self.channels.clear()
        self.upstream_closing.clear()

    @property
    def in_flight(self) -> int:
        """Publishes whose confirm or commit-ok the client still waits for."""
        return sum(channel.in_flight for channel in self.channels.values())

    @property
    def outstanding(self) -> int:
        """Messages in the client's pipe: publishes it waits to have confirmed
        (or committed) and deliveries it has not acknowledged yet."""
        count = 0
        for channel in self.channels.values():
            count += channel.in_flight + len(channel.deliveries)
        return count

    # -- actions ---------------------------------------------------------------

    def _begin(self, now: float) -> None:
        self.now = now
        acts = self._acts = Actions()
        self._up.collect(acts.to_upstream)
        self._down.collect(acts.to_client)

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
        if self._closed or (self._open and not self._flow_paused and self._closing_at is None):
            return None
        if self._closing_at is not None:
            return self._closing_at
        deadlines = []
        timeout = self.settings.handshake_timeout
        if not self._open and timeout is not None and self._started is not None:
            deadlines.append(self._started + timeout)
        if self._flow_paused:
            until = engine_pause.pause_until(self)
            if until is not None and until != float("inf"):
                deadlines.append(until)
        return min(deadlines) if deadlines else None

    def send_client(self, channel: int, frame: bytes) -> None:
        """A frame of the gateway's own for the client (see :meth:`FromUpstream.send_client`)."""
        self._from_upstream.send_client(channel, frame, self._down)

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

    def parse_client(self, data: bytes) -> None:
        inbound = self._client
        pending = inbound.pending
        pos = 0
        from_pending = False  # ``buf`` is a copy of what ``pending`` holds
        buf = data
        if pending:
            # Complete what is pending (a frame, or a message that waits whole)
            # from the head of ``data``, then scan the rest of ``data`` in
            # place instead of copying it all.
            state = _WAIT
            while state == _WAIT and self._completes_pending(len(data) - pos):
                take = pos + inbound.need - len(pending)
                pending += memoryview(data)[pos:take]
                pos = take
                state = self._scan_pending(data, pos)
            if state == _STOP:
                return
            if state == _WAIT:
                pending += memoryview(data)[pos:]
                pos = 0
                if len(pending) < inbound.need or not self._upstream_ready:
                    self._check_pre_login()
                    return
                # Scanned as bytes (one copy, once enough has arrived): the
                # hot path reads only ``bytes``, and what it forwards then
                # refers to an immutable buffer.
                buf = bytes(pending)
                from_pending = True
        elif not self._upstream_ready:
            pending += data
            self._check_pre_login()
            return
        if not self._header_seen:
            pos = self._protocol_header(buf, from_pending)
            if pos < 0:
                return
        try:
            pos = self._scan_client(buf, pos)
        except FrameError as exc:
            self._protocol_error(exc)
            return
        self._keep_rest(None if from_pending else buf, pos)

    def _completes_pending(self, rest: int) -> bool:
        """Whether ``rest`` more bytes complete what ``pending`` waits for, with
        some left over (after login: before it, everything waits in ``pending``)."""
        need, have = self._client.need, len(self._client.pending)
        return need > 7 and self._upstream_ready and self._header_seen and have < need < have + rest

    def _scan_pending(self, data: bytes, taken: int) -> int:
        """Scan ``pending``, which the first ``taken`` bytes of ``data``
        completed: :data:`_USED` when it was used up and the scan may go on
        in ``data`` from ``taken``; :data:`_WAIT` when its frame was whole but
        its message is not (``pending`` then holds the message's start and
        ``need`` says how much it needs); :data:`_STOP` when the rest of
        ``data`` was dealt with as if appended to ``pending`` before the scan."""
        pending = self._client.pending
        self._halted = False
        try:
            pos = self._scan_client(bytes(pending), 0)
        except FrameError as exc:
            self._protocol_error(exc)
            return _STOP
        free = (
            not self._halted
            and not self._passthrough
            and self._closing_at is None
            and not self._closed
        )
        if free:
            del pending[:pos]
            return _WAIT if pending else _USED
        whole = pos == len(pending) and self._closing_at is not None  # the rest goes nowhere
        pending += memoryview(data)[taken:]
        self._keep_rest(None, len(pending) if whole else pos)
        return _STOP

    def _keep_rest(self, buf: bytes | None, pos: int) -> None:
        """After a scan that stopped at ``pos``: keep what was not scanned for
        the next read (or pass it on, when RabbitMQ is to judge it).  ``buf``
        is what was scanned; None when it was ``pending`` itself."""
        pending = self._client.pending
        if buf is None:
            if self._passthrough:
                self._up.add(bytes(pending[pos:]))
                pos = len(pending)
            del pending[:pos]
        elif self._passthrough:
            self._up.add(buf[pos:])
        else:
            pending += memoryview(buf)[pos:]
        self._check_pre_login()

    def _check_pre_login(self) -> None:
        if not self._logged_in and len(self._client.pending) > PRE_LOGIN_BUFFER:
            self._client.pending.clear()
            self.close_connection(FRAME_ERROR, f"more than {PRE_LOGIN_BUFFER} bytes before login")

    def _protocol_header(self, buf: bytes, from_pending: bool) -> int:
        have = min(len(buf), 8)
        if bytes(buf[:have]) != PROTOCOL_HEADER[:have]:
            # RabbitMQ answers a bad header with its own and closes.
            self._down.add(PROTOCOL_HEADER)
            self._client.pending.clear()
            self._closed = True
            return -1
        if have < 8:
            if not from_pending:
                self._client.pending += buf
            self._client.need = 8
            return -1
        self._header_seen = True
        self._up.keep(buf, 0, 8)
        return 8

    def _scan_client(self, buf: bytes, pos: int) -> int:
        """Handle the complete frames of ``buf`` from ``pos``; returns where it stopped."""
        inbound = self._client
        size_all = len(buf)
        channels = self.channels
        up = self._up
        while size_all - pos >= 7:
            kind = buf[pos]
            number = u16(buf, pos + 1)
            size = u32(buf, pos + 3)
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
                method = u32(buf, pos + 7)
                if (
                    size == 13  # a single Basic.Ack, the consumer's commonest frame
                    and method == amqp.BASIC_ACK
                    and channel is not None
                    and not channel.closed_by_gateway
                    and self._stop_after is None
                    and number not in self.upstream_closing
                    and not self._mid_content(inbound, number)
                ):
                    channel.acked(u64(buf, pos + 11), bool(buf[pos + 19] & 1))
                    up.keep(buf, pos, end)
                    pos = end
                    continue
                if (
                    method == amqp.BASIC_PUBLISH
                    and channel is not None
                    and not channel.blockers
                    and not channel.closed_by_gateway
                    and number not in self.upstream_closing
                ):
                    unit_end = self._publish_unit(channel, buf, pos, end)
                    if unit_end > 0:
                        up.keep(buf, pos, unit_end)
                        pos = unit_end
                        if self._stop_after is not None:
                            self._halted = True
                            break
                        continue
                    if unit_end < 0:
                        # The read ends inside the body: wait for the whole
                        # message and take it as one unit then, instead of
                        # frame by frame now (the method and header could not
                        # be acted on by RabbitMQ before the body either).
                        inbound.need = -unit_end - pos
                        return pos
            keep = engine_frames.client_frame(
                self, buf, pos, end, kind=kind, number=number, channel=channel
            )
            if self._passthrough:
                return pos
            if self._closing_at is not None:  # closed meanwhile: the rest goes nowhere
                return size_all
            if keep:
                stash = self.upstream_closing.get(number) if number else None
                if stash is None:
                    up.keep(buf, pos, end)
                else:
                    stash.append(bytes(buf[pos:end]))
            pos = end
            if self._stop_after is not None and not self._mid_content(inbound, self._stop_after):
                self._halted = True
                break
        self._stop_after = None
        inbound.need = 7
        return pos

    def _publish_unit(self, channel: Channel, buf: bytes, pos: int, end: int) -> int:
        """A whole publish (method, header, one body frame) in ``buf``: account
        for it at once and return where it ends; 0 for the frame-by-frame
        path; minus where it will end when ``buf`` stops inside its body."""
        number = channel.number
        if self._mid_content(self._client, number):
            return 0
        header_end, unit_end = content_unit(buf, end, number, self._client.max_frame)
        if header_end <= 0:
            return -unit_end
        try:
            channel.start_publish(buf, pos + 7)
            info = content_properties(buf, end + 7, header_end - 1)
        except FrameError:
            channel.publish = None
            return 0
        channel.published(info)
        return unit_end

    @staticmethod
    def _mid_content(inbound: Inbound, number: int) -> bool:
        return number in inbound.expect_header or number in inbound.remaining

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

    def upstream_connection_method(self, method: int) -> None:
        """A channel-0 method from RabbitMQ on its way to the client."""
        if method == amqp.CONNECTION_TUNE:
            self._logged_in = True
        elif method == amqp.CONNECTION_OPEN_OK:
            self._open = True
        elif method == amqp.CONNECTION_CLOSE:
            self._passthrough = True  # the client's Close-Ok goes to RabbitMQ

    def _protocol_error(self, exc: FrameError) -> None:
        self._client.pending.clear()
        self.close_connection(exc.code, exc.text, wait=False)

    def counted_while_flowed(self, number: int, size: int) -> None:
        """A publish on a flowed channel (see :mod:`~rabbitflow_broker.engine_pause`)."""
        engine_pause.counted_while_flowed(self, number, size)

    def flow_ignored(self, channel: Channel) -> bool:
        """Whether ``channel`` ignores flow control (and was closed for it)."""
        return engine_pause.flow_ignored(self, channel)

    def forget_channel(self, number: int) -> None:
        """The channel is closed on both sides."""
        channel = self.channels.pop(number, None)
        self._client.expect_header.discard(number)
        self._client.remaining.pop(number, None)
        self._from_upstream.forget(number)
        if channel is not None and channel.ever_flowed:
            self.emit(channel.event_closed())

    def held_confirms(self) -> int:
        """Confirms and commit-oks currently held from the client."""
        return sum(channel.held for channel in self.channels.values())
