"""One client connection and its upstream connection, as a pure engine (sans-IO).

The driver (:mod:`~rabbitflow_broker.server.relay`) feeds the engine bytes from
either socket plus the monotonic clock and carries out the
:class:`Actions` it returns: bytes for each side, events to log, whether to
read the client socket, when to call :meth:`Engine.tick` again, and when to
close.  Like h11, the engine imports no asyncio and no socket, reads no
clock and never calls into another connection; the shared gateway state is
reached only through :class:`Hub`.

Its parts, each owning its state: the connection's lifecycle
(:class:`~rabbitflow_broker.engine.state.Lifecycle`: an enum per machine and
a table of moves), the flow-control pause
(:class:`~rabbitflow_broker.engine.pause.Pause`), each direction's scanner
(:class:`~rabbitflow_broker.engine.from_client.FromClient`,
:class:`~rabbitflow_broker.engine.from_upstream.FromUpstream`) and the channels
(:class:`~rabbitflow_broker.engine.channel.Channel`).

Hot path: each direction keeps one byte buffer with a read position;
frames are scanned in place, a publish (method, header, body) and a
delivery are handled as one unit, and the original bytes go out as runs of
the received buffer (the whole read when nothing was dropped or added).
Only the fields a decision needs are decoded (:mod:`~rabbitflow_broker.engine.amqp`).

A frame the engine cannot interpret (bad framing, malformed arguments, a
method on a channel the gateway does not know) is forwarded to RabbitMQ
unchanged and the rest of the client's bytes pass through uninterpreted:
RabbitMQ closes the connection with its own reply code, which the client
receives.  The gateway's own limits close the connection itself
(:data:`PRE_LOGIN_FRAME_MAX`, :data:`PRE_LOGIN_BUFFER`, the handshake timeout).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Final

from rabbitflow_broker.engine import amqp, amqp_encode
from rabbitflow_broker.engine.allowance import (
    PAUSE_BYTES,
    PAUSE_MESSAGES,
    REPEAT_OFFENCE_S,
    Verdict,
)
from rabbitflow_broker.engine.amqp import decode_args, text
from rabbitflow_broker.engine.channel import Channel, Connection
from rabbitflow_broker.engine.confirms import Route
from rabbitflow_broker.engine.errors import FrameError, TransitionError
from rabbitflow_broker.engine.from_client import (
    PRE_LOGIN_BUFFER,
    PRE_LOGIN_FRAME_MAX,
    FromClient,
    Session,
)
from rabbitflow_broker.engine.from_upstream import FromUpstream
from rabbitflow_broker.engine.pause import Pause
from rabbitflow_broker.engine.ports import Actions, EngineSettings, Hub, Out
from rabbitflow_broker.engine.state import CLOSED, CLOSING, PASSTHROUGH, Event, Lifecycle
from rabbitflow_broker.events import ConnectionClosed
from rabbitflow_broker.events import Event as LogEvent

__all__ = [
    "PAUSE_BYTES",
    "PAUSE_MESSAGES",
    "PRE_LOGIN_BUFFER",
    "PRE_LOGIN_FRAME_MAX",
    "Actions",
    "Engine",
    "EngineSettings",
    "Hub",
    "Lifecycle",
]

#: How long to wait for the client's Close-Ok before closing the socket.
CLOSE_GRACE_S: Final = 1.0

_CLOSE_OK = amqp_encode.CONNECTION_CLOSE_OK_FRAME
#: Event timestamps of an engine given no epoch: seconds of its clock since 1970.
_UNIX_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class Engine(Connection, Session):
    """The state machine of one relayed connection."""

    def __init__(
        self,
        hub: Hub,
        *,
        number: int,
        remote_host: str = "?",
        remote_port: int = 0,
        settings: EngineSettings | None = None,
        epoch: dt.datetime = _UNIX_EPOCH,
    ) -> None:
        self.hub = hub
        #: The wall-clock time at which the engine's clock (``now``) was 0.
        self.epoch = epoch
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
        self.upstream_node = ""
        #: RabbitMQ's Connection.Close went to the client (its Close-Ok is awaited).
        self.closed_by_upstream = False
        self.from_client = FromClient()
        self.from_upstream = FromUpstream()
        self.state = Lifecycle()
        self.pause = Pause(self.settings.flow_enforcement_timeout)
        self._started: float | None = None
        #: Whether a route is blocked, as of the last refresh (a hint: blocking
        #: itself is decided by the hub; refresh() renews it on every change).
        self.route_blocked: Callable[[Route], bool] = hub.route_blocker(self.vhost)
        self._acts = Actions()
        self.up = Out(self._acts.to_upstream)
        self._down = Out(self._acts.to_client)
        self.now = 0.0

    # -- driver interface ----------------------------------------------------

    def parse_client(self, data: bytes) -> None:
        """Scan the client's bytes (after what waited for more)."""
        self.from_client.parse(self, data)

    def start(self, now: float) -> Actions:
        """The client connected: start the handshake clock."""
        self._begin(now)
        self._started = now
        return self._finish()

    def upstream_connected(self, now: float, node: str = "") -> Actions:
        """The upstream socket is open (to RabbitMQ node ``node``, "host:port"):
        relay what the client sent meanwhile.  A Connection.Close 320 from
        RabbitMQ (the node stopping) reaches the client naming ``node``."""
        self._begin(now)
        self.upstream_node = node
        self.state.move(Event.UPSTREAM_CONNECTED)
        self.parse_client(b"")
        return self._finish()

    def upstream_failed(self, now: float, cause: str) -> Actions:
        """The upstream connection could not be opened, or ended: tell the
        client why, unless RabbitMQ's own Connection.Close reached it already
        (then its Close-Ok is awaited, as for the gateway's)."""
        self._begin(now)
        if self.closed_by_upstream:
            if not self.state.ending:
                self.state.close(now + CLOSE_GRACE_S)
        else:
            self.close_connection(amqp.CONNECTION_FORCED, cause)
        return self._finish()

    def receive_client(self, data: bytes, now: float) -> Actions:
        """Bytes from the client socket."""
        self._begin(now)
        mode = self.state.mode
        if mode is CLOSING:
            if _CLOSE_OK in data:  # the client answered the gateway's Connection.Close
                self.state.move(Event.DONE)
        elif mode is PASSTHROUGH:
            pending = self.from_client.inbound.pending
            if pending:  # what waited for more goes first: RabbitMQ judges it all
                self.up.add(bytes(pending))
                pending.clear()
            self.up.add(data)
        elif mode is not CLOSED:
            self.parse_client(data)
        return self._finish()

    def receive_upstream(self, data: bytes, now: float) -> Actions:
        """Bytes from the upstream socket."""
        self._begin(now)
        if self.state.mode is not CLOSED:
            try:
                self.from_upstream.receive(self, data, self._down, self.up)
            except (FrameError, TransitionError) as exc:
                text_ = exc.text if isinstance(exc, FrameError) else str(exc)
                self._down.add(
                    amqp_encode.close_frame(0, amqp.INTERNAL_ERROR, f"upstream: {text_}")
                )
                self.state.move(Event.DONE)
        return self._finish()

    def tick(self, now: float) -> Actions:
        """The timer the last :class:`Actions` asked for (or any later time)."""
        self._begin(now)
        state = self.state
        if state.mode is CLOSING:
            if now >= state.closing_at:
                state.move(Event.DONE)
        elif not state.open and self._handshake_expired(now):
            self.close_connection(amqp.CONNECTION_FORCED, "handshake timeout")
        else:
            self._resume_if_allowed()
        return self._finish()

    def refresh(self, now: float) -> Actions:
        """The gateway's blocking state changed: release held confirms, unflow channels."""
        self._begin(now)
        if not self.state.ending:
            hub = self.hub
            blocked = self.route_blocked = hub.route_blocker(self.vhost)
            vhost_blocked = hub.vhost_blocked(self.vhost)
            for channel in list(self.channels.values()):
                channel.refresh(blocked, vhost_blocked)
            self.pause.renew_if_free(self.channels.values())
            self._resume_if_allowed()
        return self._finish()

    def close_connection(self, code: int, text_: str, *, wait: bool = True) -> None:
        """Send the client Connection.Close; close the sockets once it answers
        (or after :data:`CLOSE_GRACE_S`), or at once without ``wait``."""
        state = self.state
        if state.ending:
            return
        self._down.add(amqp_encode.close_frame(0, code, amqp.reply_text(code, text_)))
        if state.logged_in:
            self.up.add(amqp_encode.close_frame(0, 200, "client connection closed by the gateway"))
        state.close(self.now + CLOSE_GRACE_S)
        if not wait:
            state.move(Event.DONE)

    def shutdown(self, now: float, text_: str) -> Actions:
        """Close the client with 320 and ``text_`` (the driver drained first)."""
        self._begin(now)
        self.close_connection(amqp.CONNECTION_FORCED, text_)
        return self._finish()

    def client_gone(self, now: float) -> Actions:
        """The client socket closed: log the connection's end."""
        self._begin(now)
        state = self.state
        if state.mode is not CLOSED:
            state.move(Event.DONE)
            for channel in list(self.channels.values()):
                self.forget_channel(channel.number)
            if state.open:
                self._acts.events.append(ConnectionClosed(ts=self.stamp(), **self.identity()))
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
        self.up.collect(acts.to_upstream)
        self._down.collect(acts.to_client)

    def _finish(self) -> Actions:
        self.up.flush()
        self._down.flush()
        acts = self._acts
        mode = self.state.mode
        acts.close = mode is CLOSED
        acts.read_client = self._reading(mode)
        acts.timer = self._next_timer(mode)
        return acts

    def _reading(self, mode: object) -> bool:
        if mode is CLOSED or mode is CLOSING:
            return False
        if self.state.connecting:
            return len(self.from_client.inbound.pending) < PRE_LOGIN_BUFFER
        return not self.pause.paused

    def _handshake_expired(self, now: float) -> bool:
        timeout = self.settings.handshake_timeout
        return timeout is not None and self._started is not None and now >= self._started + timeout

    def _next_timer(self, mode: object) -> float | None:
        if mode is CLOSED:
            return None
        if mode is CLOSING:
            return self.state.closing_at
        paused = self.pause.paused
        opened = self.state.open
        if opened and not paused:
            return None
        deadlines = []
        timeout = self.settings.handshake_timeout
        if not opened and timeout is not None and self._started is not None:
            deadlines.append(self._started + timeout)
        if paused:
            until = self.pause.until(self.channels.values())
            if until is not None and until != float("inf"):
                deadlines.append(until)
        return min(deadlines) if deadlines else None

    def send_client(self, channel: int, frame: bytes) -> None:
        """A frame of the gateway's own for the client (see :meth:`FromUpstream.send_client`)."""
        self.from_upstream.send_client(channel, frame, self._down)

    def send_upstream(self, frame: bytes) -> None:
        """A frame of the gateway's own for RabbitMQ, after what was read so far."""
        self.up.add(frame)

    def emit(self, event: LogEvent) -> None:
        """An event for the driver to log."""
        self._acts.events.append(event)

    def stamp(self) -> dt.datetime:
        """Wall-clock time of :attr:`now`, for event timestamps."""
        return self.epoch + dt.timedelta(seconds=self.now)

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

    def refuse(self, code: int, reason: str) -> bool:
        """A frame the gateway cannot follow.  Once the connection is open,
        RabbitMQ judges it: it and everything after go upstream unread, and
        RabbitMQ closes with its own code.  Before that, RabbitMQ would drop
        the socket without a word, so the gateway closes with ``code``.

        Raises:
            FrameError: before the connection is open.
        """
        if not self.state.open:
            raise FrameError(code, reason)
        self.state.move(Event.PASS)
        return False

    def upstream_connection_method(self, method: int) -> None:
        """A channel-0 method from RabbitMQ on its way to the client."""
        if method == amqp.CONNECTION_TUNE:
            self.state.move(Event.UPSTREAM_TUNE)
        elif method == amqp.CONNECTION_OPEN_OK:
            self.state.move(Event.UPSTREAM_OPEN_OK)
        elif method == amqp.CONNECTION_CLOSE:
            self.closed_by_upstream = True
            self.state.move(Event.PASS)  # the client's Close-Ok goes to RabbitMQ

    def connection_method(self, method: int, payload: bytes) -> bool:
        """A channel 0 method from the client; True to forward it.

        Raises:
            FrameError: malformed, out of order, or not a connection method.
        """
        if method == amqp.CONNECTION_START_OK:
            self.user, self.pause.blocked_capable = amqp.start_ok_user(payload)
        elif method == amqp.CONNECTION_TUNE_OK:
            if not self.state.can(Event.CLIENT_TUNE_OK):
                raise FrameError(amqp.UNEXPECTED_FRAME, "a second connection.tune-ok")
            frame_max = int(decode_args(method, payload)[1])  # type: ignore[call-overload]
            self.from_client.inbound.max_frame = self.from_upstream.inbound.max_frame = (
                frame_max or 1 << 31
            )
            self.state.move(Event.CLIENT_TUNE_OK)
        elif method == amqp.CONNECTION_OPEN:
            self.vhost = text(decode_args(method, payload)[0]) or "/"
            self.route_blocked = self.hub.route_blocker(self.vhost)
        elif method >> 16 != 10:
            raise FrameError(amqp.CHANNEL_ERROR, f"{amqp.method_name(method)} on channel 0")
        return True

    # -- flow control ----------------------------------------------------------------

    def counted_while_flowed(self, number: int, size: int) -> None:
        """A publish on a flowed channel: past the connection's allowance, the
        scan stops after it and reads pause (:class:`~rabbitflow_broker.engine.pause.Pause`)."""
        frame = self.pause.counted(number, size, self.now, self.channels.values())
        if frame:
            self.send_client(0, frame)

    def _resume_if_allowed(self) -> None:
        if not self.pause.paused:
            if self.from_client.inbound.pending and not self.state.connecting:
                self.parse_client(b"")
            return
        frame = self.pause.resume(self.now, self.channels.values())
        if frame is None:
            return
        if frame:
            self.send_client(0, frame)
        self.parse_client(b"")

    def flow_ignored(self, channel: Channel) -> bool:
        """True (and the channel or connection closed) when ``channel``
        publishes past its enforcement timeout."""
        verdict = self.pause.judge(self.now, channel)
        if verdict is Verdict.FORWARD:
            return False
        self.emit(channel.event_ignored())
        if verdict is Verdict.CLOSE_CONNECTION:
            self.close_connection(
                amqp.PRECONDITION_FAILED,
                f"flow control ignored again within {REPEAT_OFFENCE_S:.0f} s of a channel close",
            )
            return True
        timeout = self.settings.flow_enforcement_timeout or 0.0
        channel.close(
            amqp.PRECONDITION_FAILED,
            f"flow control ignored: still publishing {timeout * 1000:.0f} ms after "
            "Channel.Flow(active=false)",
            amqp.BASIC_PUBLISH,
        )
        return True

    def channel(self, number: int) -> Channel | None:
        """The open channel ``number`` (0: None)."""
        return self.channels.get(number) if number else None

    def open_channel(self, number: int) -> None:
        """The client opened channel ``number``."""
        self.channels[number] = Channel(self, number)

    def forget_channel(self, number: int) -> None:
        """The channel is closed on both sides."""
        channel = self.channels.pop(number, None)
        self.from_client.inbound.forget(number)
        self.from_upstream.forget(number)
        if channel is not None and channel.ever_flowed:
            self.emit(channel.event_closed())

    def held_confirms(self) -> int:
        """Confirms and commit-oks currently held from the client."""
        return sum(channel.held for channel in self.channels.values())
