"""The client -> RabbitMQ direction of one relayed connection (pure, sans-IO).

:class:`FromClient` owns the client's byte buffer: it scans each read in
place, takes a whole publish (method, header, body) and a consumer's single
ack without looking further, checks every other frame against what its
channel expects (a content header after a content method, bodies adding up
to the announced size, heartbeats on channel 0 only) and hands methods to
their :class:`~rabbitflow_broker.engine.channel.Channel` or, on channel 0,
to the engine.  Until RabbitMQ accepted the login the buffer is bounded
(:data:`PRE_LOGIN_BUFFER`) and so are frames (:data:`PRE_LOGIN_FRAME_MAX`).

It reaches its engine only through :class:`Session` (passed to each call, so
the two form no reference cycle).
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import trait

from rabbitflow_broker.engine import amqp
from rabbitflow_broker.engine.amqp import (
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    content_properties,
    u16,
    u32,
    u64,
)
from rabbitflow_broker.engine.channel import Channel
from rabbitflow_broker.engine.errors import FrameError
from rabbitflow_broker.engine.pause import Pause
from rabbitflow_broker.engine.ports import Inbound, Out, content_unit
from rabbitflow_broker.engine.state import PASSTHROUGH, RELAYING, Event, Lifecycle

__all__ = ["PRE_LOGIN_BUFFER", "PRE_LOGIN_FRAME_MAX", "FromClient", "Session"]

#: Frames larger than AMQP's frame-min-size are refused before Tune-Ok.
PRE_LOGIN_FRAME_MAX: Final = 4096
#: Bytes a connection may have buffered before RabbitMQ accepted its login.
PRE_LOGIN_BUFFER: Final = 64 * 1024

# What a scan of the pending buffer left (FromClient._scan_pending).
_USED: Final = 0
_WAIT: Final = 1
_STOP: Final = 2


@trait
class Session:
    """What the client direction needs of its engine
    (:class:`~rabbitflow_broker.engine.connection.Engine` implements it; a trait of its
    own beside :class:`~rabbitflow_broker.engine.channel.Connection`, which
    the channels see)."""

    state: Lifecycle
    pause: Pause
    #: Bytes for RabbitMQ, in order.
    up: Out
    #: The open channels by number (the scan reads it in place of :meth:`channel`).
    channels: dict[int, Channel]
    #: Frames waiting for RabbitMQ to close a channel, by number.
    upstream_closing: dict[int, list[bytes]]

    def send_client(self, channel: int, frame: bytes) -> None:
        """A frame of the gateway's own for the client."""
        raise NotImplementedError

    def channel(self, number: int) -> Channel | None:
        """The open channel ``number`` (0: None)."""
        raise NotImplementedError

    def open_channel(self, number: int) -> None:
        """The client opened channel ``number``."""
        raise NotImplementedError

    def refuse(self, code: int, reason: str) -> bool:
        """A frame the gateway cannot follow (False: not forwarded).

        Raises:
            FrameError: before the connection is open.
        """
        raise NotImplementedError

    def close_connection(self, code: int, text_: str, *, wait: bool = True) -> None:
        """Send the client Connection.Close."""
        raise NotImplementedError

    def connection_method(self, method: int, payload: bytes) -> bool:
        """A channel 0 method from the client; True to forward it."""
        raise NotImplementedError


class FromClient:
    """What the client sends one connection, on its way to RabbitMQ."""

    def __init__(self) -> None:
        self.inbound = Inbound(PRE_LOGIN_FRAME_MAX)

    def parse(self, conn: Session, data: bytes) -> None:
        """Scan ``data`` (after what waited) for ``conn``."""
        inbound = self.inbound
        pending = inbound.pending
        pos = 0
        from_pending = False  # ``buf`` is a copy of what ``pending`` holds
        buf = data
        if pending:
            # Complete what is pending (a frame, or a message that waits whole)
            # from the head of ``data``, then scan the rest of ``data`` in
            # place instead of copying it all.
            state = _WAIT
            while state == _WAIT and self._completes_pending(conn, len(data) - pos):
                take = pos + inbound.need - len(pending)
                pending += memoryview(data)[pos:take]
                pos = take
                state = self._scan_pending(conn, data, pos)
            if state == _STOP:
                return
            if state == _WAIT:
                pending += memoryview(data)[pos:]
                pos = 0
                if len(pending) < inbound.need or conn.state.connecting:
                    self._check_pre_login(conn)
                    return
                # Scanned as bytes (one copy, once enough has arrived): the
                # hot path reads only ``bytes``, and what it forwards then
                # refers to an immutable buffer.
                buf = bytes(pending)
                from_pending = True
        elif conn.state.connecting:
            pending += data
            self._check_pre_login(conn)
            return
        if not conn.state.scanning:
            pos = self._protocol_header(conn, buf, from_pending)
            if pos < 0:
                return
        try:
            pos = self._scan_client(conn, buf, pos)
        except FrameError as exc:
            self._protocol_error(conn, exc)
            return
        self._keep_rest(conn, None if from_pending else buf, pos)

    def _completes_pending(self, conn: Session, rest: int) -> bool:
        """Whether ``rest`` more bytes complete what ``pending`` waits for, with
        some left over (after login: before it, everything waits in ``pending``)."""
        need, have = self.inbound.need, len(self.inbound.pending)
        return need > 7 and conn.state.scanning and have < need < have + rest

    def _scan_pending(self, conn: Session, data: bytes, taken: int) -> int:
        """Scan ``pending``, which the first ``taken`` bytes of ``data``
        completed: :data:`_USED` when it was used up and the scan may go on
        in ``data`` from ``taken``; :data:`_WAIT` when its frame was whole but
        its message is not (``pending`` then holds the message's start and
        ``need`` says how much it needs); :data:`_STOP` when the rest of
        ``data`` was dealt with as if appended to ``pending`` before the scan."""
        pending = self.inbound.pending
        conn.pause.next_scan()
        try:
            pos = self._scan_client(conn, bytes(pending), 0)
        except FrameError as exc:
            self._protocol_error(conn, exc)
            return _STOP
        free = not conn.pause.halted and conn.state.mode is RELAYING
        if free:
            del pending[:pos]
            return _WAIT if pending else _USED
        whole = pos == len(pending) and conn.state.ending  # the rest goes nowhere
        pending += memoryview(data)[taken:]
        self._keep_rest(conn, None, len(pending) if whole else pos)
        return _STOP

    def _keep_rest(self, conn: Session, buf: bytes | None, pos: int) -> None:
        """After a scan that stopped at ``pos``: keep what was not scanned for
        the next read (or pass it on, when RabbitMQ is to judge it).  ``buf``
        is what was scanned; None when it was ``pending`` itself."""
        pending = self.inbound.pending
        if buf is None:
            if conn.state.mode is PASSTHROUGH:
                conn.up.add(bytes(pending[pos:]))
                pos = len(pending)
            del pending[:pos]
        elif conn.state.mode is PASSTHROUGH:
            conn.up.add(buf[pos:])
        else:
            pending += memoryview(buf)[pos:]
        self._check_pre_login(conn)

    def _check_pre_login(self, conn: Session) -> None:
        if not conn.state.logged_in and len(self.inbound.pending) > PRE_LOGIN_BUFFER:
            self.inbound.pending.clear()
            conn.close_connection(FRAME_ERROR, f"more than {PRE_LOGIN_BUFFER} bytes before login")

    def _protocol_header(self, conn: Session, buf: bytes, from_pending: bool) -> int:
        have = min(len(buf), 8)
        if bytes(buf[:have]) != PROTOCOL_HEADER[:have]:
            # RabbitMQ answers a bad header with its own and closes.
            conn.send_client(0, PROTOCOL_HEADER)
            self.inbound.pending.clear()
            conn.state.move(Event.DONE)
            return -1
        if have < 8:
            if not from_pending:
                self.inbound.pending += buf
            self.inbound.need = 8
            return -1
        conn.state.move(Event.CLIENT_HEADER)
        conn.up.keep(buf, 0, 8)
        return 8

    def _scan_client(self, conn: Session, buf: bytes, pos: int) -> int:
        """Handle the complete frames of ``buf`` from ``pos``; returns where it stopped."""
        inbound, size_all = self.inbound, len(buf)
        up, pause = conn.up, conn.pause
        channels, closing = conn.channels, conn.upstream_closing  # lookups, not trait calls
        expect_header, remaining = inbound.expect_header, inbound.remaining
        while size_all - pos >= 7:
            kind = buf[pos]
            number = u16(buf, pos + 1)
            size = u32(buf, pos + 3)
            end = pos + size + 8
            if size > inbound.max_frame:
                if not conn.state.tuned:
                    raise FrameError(FRAME_ERROR, f"frame of {size} bytes before tune-ok")
                conn.refuse(FRAME_ERROR, f"frame of {size} bytes exceeds frame-max")
                return pos
            if end > size_all:
                inbound.need = end - pos
                return pos
            if buf[end - 1] != 0xCE:
                conn.refuse(FRAME_ERROR, "frame does not end with 0xCE")
                return pos
            channel = channels.get(number) if number else None
            if kind == FRAME_METHOD and size >= 4:
                method = u32(buf, pos + 7)
                if (
                    size == 13  # a single Basic.Ack, the consumer's commonest frame
                    and method == amqp.BASIC_ACK
                    and channel is not None
                    and not channel.closed_by_gateway
                    and pause.stop_after is None
                    and number not in closing
                    and number not in expect_header
                    and number not in remaining
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
                    and number not in closing
                ):
                    unit_end = self._publish_unit(conn, channel, buf, pos, end)
                    if unit_end > 0:
                        up.keep(buf, pos, unit_end)
                        pos = unit_end
                        if pause.stop_after is not None:
                            pause.halted = True
                            break
                        continue
                    if unit_end < 0:
                        # The read ends inside the body: wait for the whole
                        # message and take it as one unit then, instead of
                        # frame by frame now (the method and header could not
                        # be acted on by RabbitMQ before the body either).
                        inbound.need = -unit_end - pos
                        return pos
            keep = self._client_frame(conn, buf, pos, end, kind, number, channel)
            mode = conn.state.mode
            if mode is PASSTHROUGH:
                return pos
            if mode is not RELAYING:  # closed meanwhile: the rest goes nowhere
                return size_all
            if keep and number in closing:  # RabbitMQ is closing the channel: held
                closing[number].append(bytes(buf[pos:end]))
            elif keep:
                up.keep(buf, pos, end)
            pos = end
            if pause.stop_after is not None and not inbound.mid_content(pause.stop_after):
                pause.halted = True
                break
        pause.stop_after = None
        inbound.need = 7
        return pos

    def _publish_unit(self, conn: Session, channel: Channel, buf: bytes, pos: int, end: int) -> int:
        """A whole publish (method, header, one body frame) in ``buf``: account
        for it at once and return where it ends; 0 for the frame-by-frame
        path; minus where it will end when ``buf`` stops inside its body."""
        number = channel.number
        if self.inbound.mid_content(number):
            return 0
        header_end, unit_end = content_unit(buf, end, number, self.inbound.max_frame)
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

    def _protocol_error(self, conn: Session, exc: FrameError) -> None:
        self.inbound.pending.clear()
        conn.close_connection(exc.code, exc.text, wait=False)

    def _client_frame(  # noqa: PLR0917 - the scan loop's locals, positionally
        self,
        conn: Session,
        buf: bytes,
        pos: int,
        end: int,
        kind: int,
        number: int,
        channel: Channel | None,
    ) -> bool:
        """A client frame the hot path did not take, checked against what its
        channel expects; True to forward it.  One the gateway cannot follow
        is refused (:meth:`_refuse`)."""
        try:
            if kind == FRAME_BODY:
                self.inbound.body(number, end - pos - 8)
            elif kind == FRAME_HEADER:
                info = self.inbound.header(number, buf, pos + 7, end - 1)
                if channel is not None and channel.publish is not None:
                    channel.published(info)
            elif kind == FRAME_HEARTBEAT:
                return True if number == 0 else conn.refuse(FRAME_ERROR, "heartbeat on a channel")
            elif kind != FRAME_METHOD or end - pos < 12:
                raise FrameError(FRAME_ERROR, f"bad frame of type {kind} and size {end - pos - 8}")
            else:
                payload = bytes(buf[pos + 7 : end - 1])
                return self._client_method(conn, number, u32(buf, pos + 7), payload)
        except FrameError as exc:
            return conn.refuse(exc.code, exc.text)
        return channel is None or channel.keep_content()

    def _client_method(self, conn: Session, number: int, method: int, payload: bytes) -> bool:
        """A method frame from the client; True to forward it.

        Raises:
            FrameError: out of order, malformed, or on a channel not open.
        """
        self.inbound.method(number, method)
        if number == 0:
            return conn.connection_method(method, payload)
        channel = conn.channel(number)
        if channel is not None:
            return channel.client_method(method, payload)
        if method != amqp.CHANNEL_OPEN:
            raise FrameError(amqp.CHANNEL_ERROR, "expected 'channel.open'")
        conn.open_channel(number)
        return True
