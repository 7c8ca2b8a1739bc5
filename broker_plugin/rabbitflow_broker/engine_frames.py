"""Client frames the engine's hot path does not take, checked one by one.

The engine (:mod:`~rabbitflow_broker.engine`) takes a whole publish and a
consumer's single ack without looking further.  Every other client frame
comes here: its framing is checked against what the channel expects (a
content header after a content method, bodies adding up to the announced
size, heartbeats on channel 0 only), channel 0 methods update the
connection's state (user, frame-max, virtual host), and channel methods go
to their :class:`~rabbitflow_broker.engine_channel.Channel`.  A frame the
gateway cannot follow is refused (``Engine._refuse``): RabbitMQ judges it
once the connection is open, the gateway closes the connection before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from rabbitflow_broker import amqp
from rabbitflow_broker.amqp import CONTENT_METHODS, content_properties, decode_args, text, u32
from rabbitflow_broker.engine_channel import Channel
from rabbitflow_broker.frames import FRAME_ERROR, UNEXPECTED_FRAME, FrameError

if TYPE_CHECKING:
    from rabbitflow_broker.engine import Engine

__all__ = ["client_frame", "connection_method"]

_METHOD: Final = 1
_HEADER: Final = 2
_BODY: Final = 3
_HEARTBEAT: Final = 8


def client_frame(
    engine: Engine,
    buf: bytes,
    pos: int,
    end: int,
    *,
    kind: int,
    number: int,
    channel: Channel | None,
) -> bool:
    """The client frame ``buf[pos:end]`` on channel ``number``; True to forward it."""
    inbound = engine._client
    if kind == _BODY:
        remaining = inbound.remaining.get(number)
        if remaining is None or number == 0:
            return engine._refuse(UNEXPECTED_FRAME, f"body frame on channel {number}")
        remaining -= end - pos - 8
        if remaining > 0:
            inbound.remaining[number] = remaining
        else:
            del inbound.remaining[number]
            if remaining < 0:
                return engine._refuse(FRAME_ERROR, "body longer than its header announced")
        return channel is None or channel.keep_content()
    if kind == _HEADER:
        if number not in inbound.expect_header:
            return engine._refuse(UNEXPECTED_FRAME, f"content header on channel {number}")
        inbound.expect_header.discard(number)
        try:
            info = content_properties(buf, pos + 7, end - 1)
        except FrameError as exc:
            return engine._refuse(exc.code, exc.text)
        if info.body_size:
            inbound.remaining[number] = info.body_size
        if channel is not None and channel.publish is not None:
            channel.published(info)
        return channel is None or channel.keep_content()
    if kind == _HEARTBEAT:
        return True if number == 0 else engine._refuse(FRAME_ERROR, "heartbeat on a channel")
    if kind != _METHOD or end - pos < 12:
        return engine._refuse(FRAME_ERROR, f"bad frame of type {kind} and size {end - pos - 8}")
    method = u32(buf, pos + 7)
    if number in inbound.expect_header or number in inbound.remaining:
        return engine._refuse(UNEXPECTED_FRAME, f"method frame on channel {number} mid-content")
    if method in CONTENT_METHODS:
        inbound.expect_header.add(number)
    payload = bytes(buf[pos + 7 : end - 1])
    try:
        if number == 0:
            return connection_method(engine, method, payload)
        if channel is None:
            if method != amqp.CHANNEL_OPEN:
                return engine._refuse(amqp.CHANNEL_ERROR, "expected 'channel.open'")
            engine.channels[number] = Channel(engine, number)
            return True
        return channel.client_method(method, payload)
    except FrameError as exc:
        return engine._refuse(exc.code, exc.text)


def connection_method(engine: Engine, method: int, payload: bytes) -> bool:
    """A channel 0 method from the client; True to forward it."""
    if method == amqp.CONNECTION_START_OK:
        engine.user, engine._blocked_capable = amqp.start_ok_user(payload)
    elif method == amqp.CONNECTION_TUNE_OK:
        frame_max = int(decode_args(method, payload)[1])  # type: ignore[call-overload]
        limit = frame_max or 1 << 31
        engine._client.max_frame = limit
        engine._upstream.max_frame = limit
        engine._tuned = True
    elif method == amqp.CONNECTION_OPEN:
        engine.vhost = text(decode_args(method, payload)[0]) or "/"
        engine.route_blocked = engine.hub.route_blocker(engine.vhost)
    elif method >> 16 != 10:
        return engine._refuse(amqp.CHANNEL_ERROR, f"{amqp.method_name(method)} on channel 0")
    return True
