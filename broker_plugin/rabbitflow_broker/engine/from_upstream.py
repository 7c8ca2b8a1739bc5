"""The RabbitMQ -> client direction of one relayed connection (pure, sans-IO).

RabbitMQ's bytes are trusted to be well formed (a framing error from it
closes the client with 541).  :class:`FromUpstream` scans them in place,
takes a delivery (method, header, body) as one unit, passes each method to
its channel (confirms, commit-oks, consumer and declare answers) and keeps
frames the gateway adds for a channel out of the middle of a delivery.
"""

from __future__ import annotations

from rabbitflow_broker.engine import amqp
from rabbitflow_broker.engine.amqp import (
    CONTENT_METHODS,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_METHOD,
    u16,
    u32,
    u64,
)
from rabbitflow_broker.engine.amqp_encode import name_node
from rabbitflow_broker.engine.channel import Channel, Connection
from rabbitflow_broker.engine.errors import FrameError
from rabbitflow_broker.engine.ports import Inbound, Out, content_unit

__all__ = ["FromUpstream"]


class FromUpstream:
    """What RabbitMQ sends one connection, on its way to the client."""

    def __init__(self) -> None:
        # No reference to the engine: it passes itself to each call, so the
        # two form no cycle and a closed connection is freed by refcounting.
        self.inbound = Inbound(1 << 31)
        # Frames of the gateway's own waiting for a delivery on their channel to end.
        self.deferred: list[tuple[int, bytes]] = []

    def mid_content(self, number: int) -> bool:
        """True while a message to the client on that channel is incomplete."""
        inbound = self.inbound
        return number in inbound.remaining or number in inbound.expect_header

    def send_client(self, channel: int, frame: bytes, down: Out) -> None:
        """A frame of the gateway's own: never inside a delivery on its channel,
        never ahead of an earlier one for it."""
        if self.mid_content(channel) or (
            self.deferred and any(number == channel for number, _ in self.deferred)
        ):
            self.deferred.append((channel, frame))
        else:
            down.add(frame)

    def forget(self, number: int) -> None:
        """The channel is closed: drop what waits for it."""
        self.deferred = [(n, f) for n, f in self.deferred if n != number]

    def receive(self, conn: Connection, data: bytes, down: Out, up: Out) -> None:
        """Scan ``data`` for ``conn``; frames for the client go to ``down``.

        Raises:
            FrameError: RabbitMQ sent something that is not AMQP.
        """
        inbound = self.inbound
        pending = inbound.pending
        if pending:
            pending += data
            if len(pending) < inbound.need:
                return
            buf = bytes(pending)  # scanned as bytes, like the client's (Engine.parse_client)
            pos = self._scan(conn, buf, down, up)
            del pending[:pos]
        else:
            pos = self._scan(conn, data, down, up)
            pending += memoryview(data)[pos:]
        if self.deferred:
            ready = [(n, f) for n, f in self.deferred if not self.mid_content(n)]
            if ready:
                self.deferred = [d for d in self.deferred if d not in ready]
                for _, frame in ready:
                    down.add(frame)

    def _scan(self, conn: Connection, buf: bytes, down: Out, up: Out) -> int:
        inbound = self.inbound
        size_all = len(buf)
        pos = 0
        channels = conn.channels
        closing = conn.upstream_closing
        while size_all - pos >= 7:
            kind = buf[pos]
            number = u16(buf, pos + 1)
            size = u32(buf, pos + 3)
            if size > inbound.max_frame:
                raise FrameError(FRAME_ERROR, f"frame of {size} bytes exceeds frame-max")
            end = pos + size + 8
            if end > size_all:
                inbound.need = end - pos
                return pos
            if buf[end - 1] != 0xCE:
                raise FrameError(FRAME_ERROR, "frame does not end with 0xCE")
            channel = channels.get(number) if number else None
            if (
                size == 13  # a publisher confirm, the commonest frame under load
                and channel is not None
                and kind == FRAME_METHOD
                and buf[end - 2] <= 1  # multiple or not; never a nack
                and u32(buf, pos + 7) == amqp.BASIC_ACK
                and channel.confirm is not None
                and number not in closing
                and channel.ack_as_is(channel.confirm, u64(buf, pos + 11), buf[end - 2] == 1)
            ):
                down.keep(buf, pos, end)
                pos = end
                continue
            if (
                kind == FRAME_METHOD
                and channel is not None
                and size >= 4
                and u32(buf, pos + 7) == amqp.BASIC_DELIVER
                and number not in closing
                and not self.mid_content(number)
            ):
                header_end, unit_end = content_unit(buf, end, number, inbound.max_frame)
                if header_end > 0:
                    channel.deliver(buf, pos + 7)
                    channel.delivered(unit_end - header_end - 8)
                    down.keep(buf, pos, unit_end)
                    pos = unit_end
                    continue
            if number == 0 and kind == FRAME_METHOD and _rewritten(conn, buf, pos, end, down):
                pos = end
                continue
            if self._frame(conn, buf, pos, end, kind, number, channel, up):
                down.keep(buf, pos, end)
            pos = end
        inbound.need = 7
        return pos

    def _frame(  # noqa: PLR0917 - the hot loop's locals, positionally
        self,
        conn: Connection,
        buf: bytes,
        pos: int,
        end: int,
        kind: int,
        number: int,
        channel: Channel | None,
        up: Out,
    ) -> bool:
        """One frame from RabbitMQ; True to forward it to the client."""
        inbound = self.inbound
        closing = number in conn.upstream_closing
        if kind == FRAME_BODY:
            remaining = inbound.remaining.get(number, 0) - (end - pos - 8)
            if remaining > 0:
                inbound.remaining[number] = remaining
            else:
                inbound.remaining.pop(number, None)
            return not closing
        if kind == FRAME_HEADER:
            inbound.expect_header.discard(number)
            body_size = u64(buf, pos + 11) if end - pos >= 19 else 0
            if body_size:
                inbound.remaining[number] = body_size
            if channel is not None and not closing:
                channel.delivered(body_size)
            return not closing
        if kind != FRAME_METHOD or end - pos < 12:
            return not closing
        method = u32(buf, pos + 7)
        inbound.remaining.pop(number, None)
        inbound.expect_header.discard(number)
        if method in CONTENT_METHODS:
            inbound.expect_header.add(number)
        if closing:
            # Swallow what RabbitMQ still sends on a channel the gateway closed;
            # its CloseOk lets a reopen of the number through.
            if method == amqp.CHANNEL_CLOSE_OK:
                stash = conn.upstream_closing.pop(number)
                if stash:
                    up.add(b"".join(stash))
            return False
        if number == 0:
            conn.upstream_connection_method(method)
            return True
        if channel is None:
            return True
        return channel.upstream_method(method, bytes(buf[pos + 7 : end - 1]))


def _rewritten(conn: Connection, buf: bytes, pos: int, end: int, down: Out) -> bool:
    """A connection method from RabbitMQ that the client gets rewritten (sent
    to ``down`` here: True): Connection.Start says that a gateway answers,
    not RabbitMQ; a Connection.Close 320 (a node stopping) names the node."""
    if end - pos < 12:
        return False
    method = u32(buf, pos + 7)
    if method == amqp.CONNECTION_START:
        down.add(amqp.announce_gateway(bytes(buf[pos:end]), conn.settings.server))
        return True
    if method == amqp.CONNECTION_CLOSE and conn.upstream_node:
        conn.upstream_connection_method(method)  # the client's Close-Ok goes to RabbitMQ
        down.add(name_node(bytes(buf[pos:end]), conn.upstream_node))
        return True
    return False
