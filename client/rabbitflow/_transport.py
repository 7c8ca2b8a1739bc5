"""The AMQP transport: the only module that imports pika.

One ``PikaTransport`` per connection runs a pika ``SelectConnection`` on its
own I/O thread; pika is not thread-safe, so every call from another thread is
marshalled onto that thread (``post`` / blocking ``call`` and channel RPCs).
Callbacks to the layers above (``ChannelHandler``, ``TransportListener``) run
on the I/O thread and must not block.  pika exceptions are translated here,
most specific first, and never leak.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pika
import pika.data
import pika.exceptions
import pika.frame
import pika.spec

from ._exceptions import (
    BrokerError,
    ConnectionLostError,
    IllegalStateError,
    InvalidDestinationError,
    JMSException,
    ProtocolError,
    TLSError,
)
from ._log import get_logger
from ._message import WireProperties

__all__ = [
    "ChannelHandler",
    "Delivery",
    "PikaTransport",
    "TransportChannel",
    "TransportListener",
    "translate_error",
]

R = TypeVar("R")

_NOT_FOUND = 404
_RPC_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message the broker delivered to a consumer."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    body: bytes
    properties: WireProperties


class ChannelHandler(Protocol):
    """Receives a channel's asynchronous events, on the I/O thread."""

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Publisher confirm (Basic.Ack / Basic.Nack)."""

    def on_flow(self, active: bool) -> None:
        """Channel.Flow from the broker."""

    def on_deliver(self, delivery: Delivery) -> None:
        """Basic.Deliver for a consumer of this channel."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Basic.Return of a mandatory publish."""

    def on_channel_closed(self, error: JMSException) -> None:
        """The broker closed the channel (not when the connection was lost)."""


class TransportListener(Protocol):
    """Receives connection-level events, on the I/O thread."""

    def on_blocked(self, reason: str) -> None:
        """connection.blocked."""

    def on_unblocked(self) -> None:
        """connection.unblocked."""

    def on_lost(self, error: ConnectionLostError) -> None:
        """The connection died without close() being called."""


def _tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``exc`` (pika wraps it in its own), if any."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        pending += [a for a in current.args if isinstance(a, BaseException)]
        # pika's connection workflow keeps each attempt's error in a list, and
        # each phase error its cause in ``exception``.
        pending += [a for a in getattr(current, "exceptions", None) or () if a is not None]
        inner = getattr(current, "exception", None)
        if isinstance(inner, BaseException):
            pending.append(inner)
        pending += [a for a in (current.__cause__, current.__context__) if a is not None]
    return None


class _Detached:
    """The handler of a detached channel: drops every event."""

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Dropped."""

    def on_flow(self, active: bool) -> None:
        """Dropped."""

    def on_deliver(self, delivery: Delivery) -> None:
        """Dropped."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Dropped."""

    def on_channel_closed(self, error: JMSException) -> None:
        """Dropped."""


_DETACHED: ChannelHandler = _Detached()


def translate_error(exc: BaseException) -> JMSException:
    """The rabbitflow exception for a pika exception (most specific first)."""
    if isinstance(exc, JMSException):
        return exc
    tls = _tls_failure(exc)
    if isinstance(tls, ssl.SSLCertVerificationError):
        return TLSError(
            f"TLS certificate verification failed: {tls.verify_message or tls} "
            "(the broker's certificate is not signed by a CA this client trusts: "
            "see rabbitflow.ssl.ca_file or ssl_context)"
        )
    if tls is not None:
        return TLSError(f"TLS handshake failed: {tls}")
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        code, text = exc.reply_code, exc.reply_text
        if code == _NOT_FOUND:
            return InvalidDestinationError(f"{code} {text}", reply_code=code)
        return BrokerError(f"channel closed by broker: {code} {text}", reply_code=code)
    if isinstance(
        exc, pika.exceptions.ProbableAuthenticationError | pika.exceptions.ProbableAccessDeniedError
    ):
        return BrokerError(f"access refused: {exc}", reply_code=403)
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        return ConnectionLostError(
            f"connection closed by broker: {exc.reply_code} {exc.reply_text}"
        )
    if isinstance(exc, pika.exceptions.ChannelClosed | pika.exceptions.ChannelWrongStateError):
        return ProtocolError(f"channel closed: {exc}")
    if isinstance(
        exc, pika.exceptions.AMQPConnectionError | pika.exceptions.ConnectionWrongStateError
    ):
        return ConnectionLostError(f"connection lost: {exc!r}")
    if isinstance(exc, pika.exceptions.AMQPError):
        return ProtocolError(f"AMQP error: {exc!r}")
    if isinstance(exc, OSError):
        return ConnectionLostError(f"connection lost: {exc!r}")
    return JMSException(f"unexpected transport error: {exc!r}")


def _to_pika(props: WireProperties) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type=props.content_type,
        content_encoding=props.content_encoding,
        headers=props.headers,
        delivery_mode=props.delivery_mode,
        priority=props.priority,
        correlation_id=props.correlation_id,
        reply_to=props.reply_to,
        expiration=props.expiration,
        message_id=props.message_id,
        timestamp=props.timestamp,
        type=props.type,
    )


def _from_pika(props: pika.BasicProperties) -> WireProperties:
    return WireProperties(
        content_type=props.content_type,
        content_encoding=props.content_encoding,
        headers=props.headers,
        delivery_mode=props.delivery_mode,
        priority=props.priority,
        correlation_id=props.correlation_id,
        reply_to=props.reply_to,
        expiration=props.expiration,
        message_id=props.message_id,
        timestamp=props.timestamp,
        type=props.type,
    )


# ------------------------------------------------------------ publish frames
# Encoding a publish with pika builds a Method, a Header and BasicProperties
# object per message and walks pika's generic encoders; for the publish path
# the frames are simple enough to write directly: the method frame depends
# only on (channel, exchange, routing key, mandatory) and is cached, the
# content header is packed field by field, and the header table of
# application properties (usually the same few keys) is cached by value.
_FRAME_END = b"\xce"
_HEADER_PREFIX = struct.Struct(">BHIHHQH")  # type, channel, size, class, weight, body size, flags
_BODY_PREFIX = struct.Struct(">BHI")
_TABLE_SIZE = struct.Struct(">I")
_INT32 = struct.Struct(">ci")  # pika's table value for an int that fits 32 bits
_INT64 = struct.Struct(">cq")  # ... and for a larger one


class _PublishEncoder:
    """Encodes Basic.Publish + content header + body frames to bytes."""

    def __init__(self) -> None:
        self._methods: dict[tuple[int, str, str, bool], bytes] = {}
        self._tables: dict[tuple[tuple[str, Any], ...], bytes] = {}
        self._keys: dict[str, bytes] = {}  # header name -> short string

    @staticmethod
    def _short(text: str) -> bytes:
        data = text.encode()
        if len(data) > 255:
            raise ValueError(f"AMQP short string too long ({len(data)} bytes)")
        return bytes((len(data),)) + data

    def _method(self, channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        key = (channel, exchange, routing_key, mandatory)
        frame = self._methods.get(key)
        if frame is None:
            payload = (
                struct.pack(">HHH", 60, 40, 0)
                + self._short(exchange)
                + self._short(routing_key)
                + (b"\x01" if mandatory else b"\x00")
            )
            frame = struct.pack(">BHI", 1, channel, len(payload)) + payload + _FRAME_END
            if len(self._methods) > 1000:
                self._methods.clear()
            self._methods[key] = frame
        return frame

    def _table(self, headers: dict[str, Any]) -> bytes:
        if len(headers) == 1:
            # The common case, ``{"JMSTimestamp": ms}``: its value differs in
            # every message, so the cache below would only miss; pack it here
            # exactly as pika's encode_table does.
            ((name, value),) = headers.items()
            if type(value) is int:
                short = self._keys.get(name)
                if short is None:
                    short = self._short(name)
                    if len(self._keys) > 1000:
                        self._keys.clear()
                    self._keys[name] = short
                if -0x80000000 <= value <= 0x7FFFFFFF:
                    return _TABLE_SIZE.pack(len(short) + 5) + short + _INT32.pack(b"I", value)
                return _TABLE_SIZE.pack(len(short) + 9) + short + _INT64.pack(b"l", value)
        try:
            key = tuple(sorted(headers.items()))
            hash(key)
        except TypeError:  # unhashable values: encode without the cache
            pieces: list[bytes] = []
            pika.data.encode_table(pieces, headers)
            return b"".join(pieces)
        table = self._tables.get(key)
        if table is None:
            pieces = []
            pika.data.encode_table(pieces, headers)
            table = b"".join(pieces)
            if len(self._tables) > 1000:
                self._tables.clear()
            self._tables[key] = table
        return table

    def _properties(self, props: WireProperties) -> tuple[int, bytes]:
        flags = 0
        out: list[bytes] = []
        short = self._short
        if props.content_type is not None:
            flags |= 1 << 15
            out.append(short(props.content_type))
        if props.content_encoding is not None:
            flags |= 1 << 14
            out.append(short(props.content_encoding))
        if props.headers is not None:
            flags |= 1 << 13
            out.append(self._table(props.headers))
        if props.delivery_mode is not None:
            flags |= 1 << 12
            out.append(bytes((props.delivery_mode,)))
        if props.priority is not None:
            flags |= 1 << 11
            out.append(bytes((props.priority,)))
        if props.correlation_id is not None:
            flags |= 1 << 10
            out.append(short(props.correlation_id))
        if props.reply_to is not None:
            flags |= 1 << 9
            out.append(short(props.reply_to))
        if props.expiration is not None:
            flags |= 1 << 8
            out.append(short(props.expiration))
        if props.message_id is not None:
            flags |= 1 << 7
            out.append(short(props.message_id))
        if props.timestamp is not None:
            flags |= 1 << 6
            out.append(struct.pack(">Q", props.timestamp))
        if props.type is not None:
            flags |= 1 << 5
            out.append(short(props.type))
        return flags, b"".join(out)

    def encode(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        props: WireProperties,
        *,
        mandatory: bool,
        body_max: int,
    ) -> bytes:
        """The frames of one publish, joined.

        Raises:
            ValueError: a value that does not fit its AMQP field.
        """
        flags, fields = self._properties(props)
        size = len(body)
        parts = [
            self._method(channel, exchange, routing_key, mandatory),
            _HEADER_PREFIX.pack(2, channel, 14 + len(fields), 60, 0, size, flags),
            fields,
            _FRAME_END,
        ]
        for start in range(0, size, body_max):
            chunk = body[start : start + body_max]
            parts += [_BODY_PREFIX.pack(3, channel, len(chunk)), chunk, _FRAME_END]
        return b"".join(parts)


def _coalesce_writes(connection: Any) -> None:
    """Make pika send its queued frames with one ``send()`` per batch.

    pika writes each frame (three per published message) with its own
    syscall; each releases the GIL, which the application's sending thread
    then takes, so the I/O thread crawls.  Joining the queued chunks first
    keeps the bytes and their order and cuts the syscalls to one per batch.
    Skipped if pika's internals are not as expected.
    """
    transport: Any = getattr(connection, "_transport", None)
    produce = getattr(transport, "_produce", None)
    buffers = getattr(transport, "_tx_buffers", None)
    if produce is None or not isinstance(buffers, collections.deque):
        return

    def produce_joined() -> None:
        if len(buffers) > 1:
            joined = b"".join(buffers)
            buffers.clear()
            buffers.append(joined)
        produce()

    transport._produce = produce_joined


class TransportChannel:
    """One AMQP channel.  Blocking methods may be called from any thread but
    the I/O thread; ``publish``/``ack``/``reject``/``qos_nowait`` only on the
    I/O thread (inside ``PikaTransport.post``)."""

    def __init__(self, transport: PikaTransport, channel: Any, handler: ChannelHandler) -> None:
        self._transport = transport
        self._channel = channel
        self._handler: ChannelHandler = handler
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._consumer_tag: str | None = None
        self._qos_pending = 0  # basic.qos sent, qos-ok not yet received
        self._held_acks: list[tuple[int, bool]] = []  # acks waiting for those qos-oks
        self.closing = False
        self.closed = False
        channel.add_on_close_callback(self._on_closed)
        channel.add_on_flow_callback(self._on_flow)
        channel.add_on_return_callback(self._on_return)
        channel.add_on_cancel_callback(self._on_cancel)

    def detach(self) -> None:
        """Stop passing this channel's events on (its connection was lost and
        the handler moved on to another channel)."""
        self._handler = _DETACHED

    @property
    def number(self) -> int:
        """The AMQP channel number."""
        return int(self._channel.channel_number)

    # ------------------------------------------------------- pika callbacks
    def _on_closed(self, _channel: Any, reason: BaseException) -> None:
        self.closed = True
        error = translate_error(reason)
        for future in list(self._pending):
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        # Only a close of this channel by the broker concerns the handler; a
        # dying connection closes its channels first, with its own reason.
        by_broker = isinstance(reason, pika.exceptions.ChannelClosedByBroker)
        if by_broker and not self.closing and not self._transport.closing:
            self._handler.on_channel_closed(error)

    def _on_flow(self, frame_or_active: Any) -> None:
        # pika documents a bool but passes the Channel.Flow method frame.
        method = getattr(frame_or_active, "method", frame_or_active)
        active = bool(getattr(method, "active", method))
        self._handler.on_flow(active)

    def _on_return(self, _channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        self._handler.on_return(method.reply_code, method.reply_text, method.routing_key)

    def _on_cancel(self, _frame: Any) -> None:
        if not self.closing:
            self._handler.on_channel_closed(
                InvalidDestinationError("the broker cancelled the consumer (queue deleted?)")
            )

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        self._handler.on_confirm(
            method.delivery_tag, method.multiple, isinstance(method, pika.spec.Basic.Ack)
        )

    def _on_message(self, _channel: Any, method: Any, props: Any, body: bytes) -> None:
        self._handler.on_deliver(
            Delivery(
                method.delivery_tag,
                method.redelivered,
                method.exchange,
                method.routing_key,
                body,
                _from_pika(props),
            )
        )

    # --------------------------------------------------------------- rpc
    def _rpc(
        self,
        start: Callable[[Callable[[Any], None]], None],
        *,
        timeout: float | None = _RPC_TIMEOUT,
    ) -> Any:
        """Run ``start(callback)`` on the I/O thread; wait for the callback's frame.

        Raises:
            JMSException: the channel or connection closed first (translated).
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def done(result: Any = None) -> None:
            self._pending.discard(future)
            if not future.done():
                future.set_result(result)

        def run() -> None:
            if self.closed:
                future.set_exception(ProtocolError("channel is closed"))
                return
            self._pending.add(future)
            try:
                start(done)
            except Exception as exc:
                self._pending.discard(future)
                future.set_exception(translate_error(exc))

        self._transport.post(run)
        return self._transport.wait(future, timeout=timeout)

    def confirm_select(self) -> None:
        """Put the channel in confirm mode (acks go to ``on_confirm``).

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.confirm_delivery(self._on_confirm, callback=cb))

    def tx_select(self) -> None:
        """Put the channel in transaction mode.

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.tx_select(callback=cb))

    def tx_commit(self) -> None:
        """Commit (returns on tx.commit-ok; a flow-controlling broker may hold
        it for as long as its queues stay over their thresholds, so there is
        no time limit while the connection lives).

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.tx_commit(callback=cb), timeout=None)

    def tx_rollback(self) -> None:
        """Roll back.

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.tx_rollback(callback=cb))

    def qos(self, prefetch_count: int, *, global_qos: bool = True) -> None:
        """Set the prefetch count and wait for qos-ok.

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(
            lambda cb: self._channel.basic_qos(
                prefetch_count=prefetch_count, global_qos=global_qos, callback=cb
            )
        )

    def queue_declare(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> tuple[str, int, int]:
        """Declare a queue; returns (name, message count, consumer count).

        Raises:
            InvalidDestinationError: passive and the queue does not exist (the
                channel is then closed).
            JMSException: another failure.
        """
        frame = self._rpc(
            lambda cb: self._channel.queue_declare(
                name,
                passive=passive,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
                callback=cb,
            )
        )
        method = frame.method
        return str(method.queue), int(method.message_count), int(method.consumer_count)

    def exchange_declare(
        self, name: str, kind: str, *, durable: bool = True, passive: bool = False
    ) -> None:
        """Declare an exchange.

        Raises:
            JMSException: the broker refused (e.g. it exists with another type).
        """
        self._rpc(
            lambda cb: self._channel.exchange_declare(
                name, exchange_type=kind, durable=durable, passive=passive, callback=cb
            )
        )

    def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        """Bind ``queue`` to ``exchange``.

        Raises:
            JMSException: the broker refused.
        """
        self._rpc(
            lambda cb: self._channel.queue_bind(
                queue, exchange, routing_key=routing_key, callback=cb
            )
        )

    def queue_delete(self, queue: str) -> None:
        """Delete ``queue``.

        Raises:
            JMSException: the broker refused.
        """
        self._rpc(lambda cb: self._channel.queue_delete(queue, callback=cb))

    def basic_consume(self, queue: str, *, exclusive: bool = False) -> str:
        """Start consuming ``queue`` (deliveries go to ``on_deliver``); returns the tag.

        Raises:
            JMSException: the broker refused (e.g. no such queue).
        """
        tag: list[str] = []

        def start(cb: Callable[[Any], None]) -> None:
            tag.append(
                self._channel.basic_consume(
                    queue, self._on_message, auto_ack=False, exclusive=exclusive, callback=cb
                )
            )

        self._rpc(start)
        return tag[0]

    def basic_consume_nowait(self, queue: str, *, exclusive: bool = False) -> None:
        """basic.consume from the I/O thread without waiting for consume-ok."""
        if not self.closed and self._channel.is_open:
            self._consumer_tag = self._channel.basic_consume(
                queue, self._on_message, auto_ack=False, exclusive=exclusive
            )

    def basic_cancel_nowait(self) -> None:
        """basic.cancel of the consumer started by ``basic_consume_nowait`` (I/O
        thread only).  Deliveries already on their way are rejected back to
        the queue by pika."""
        tag, self._consumer_tag = self._consumer_tag, None
        if tag is not None and not self.closed and self._channel.is_open:
            self._channel.basic_cancel(tag)

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        """Passive queue.declare; ``on_depth(message_count)`` runs on the I/O
        thread when the answer comes (I/O thread only)."""
        if not self.closed and self._channel.is_open:
            self._channel.queue_declare(
                queue, passive=True, callback=lambda frame: on_depth(frame.method.message_count)
            )

    def basic_cancel(self, consumer_tag: str) -> None:
        """Stop a consumer.

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.basic_cancel(consumer_tag, callback=cb))

    def basic_recover(self) -> None:
        """Redeliver every unacked message of this channel.

        Raises:
            JMSException: the channel or connection failed.
        """
        self._rpc(lambda cb: self._channel.basic_recover(requeue=True, callback=cb))

    def close(self) -> None:
        """Close the channel (no error if it is already closed)."""
        if self.closed or self.closing:
            return
        self.closing = True
        if self._transport.lost or self._transport.closing:
            return
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            if self.closed:
                future.set_result(None)
                return
            self._channel.add_on_close_callback(lambda *_: future.set_result(None))
            # Acks held for a qos-ok go out now: pika would send the close
            # first, and a closing channel takes no acks.  The prefetch no
            # longer matters.
            held, self._held_acks = self._held_acks, []
            self._qos_pending = 0
            for tag, multiple in held:
                self.ack(tag, multiple=multiple)
            try:
                self._channel.close()
            except pika.exceptions.AMQPError:
                future.set_result(None)

        self._transport.post(run)
        # If the connection went away the channel is closed either way.
        with contextlib.suppress(JMSException):
            self._transport.wait(future)

    # ---------------------------------------------------- I/O thread only
    def publish(
        self, exchange: str, routing_key: str, body: bytes, props: WireProperties, mandatory: bool
    ) -> None:
        """basic.publish (I/O thread only).

        Raises:
            JMSException: the channel is closed (translated).
        """
        self.publish_many([(exchange, routing_key, body, props)], mandatory)

    def publish_many(
        self, items: list[tuple[str, str, bytes, WireProperties]], mandatory: bool
    ) -> None:
        """basic.publish each of ``items`` (exchange, routing key, body,
        properties) in order, encoded here and written to the connection's
        buffer at once (I/O thread only).

        Raises:
            JMSException: the channel is closed (translated).
        """
        output = self._transport.raw_output()
        if output is None:  # pika's internals are not as expected: its own path
            try:
                for exchange, routing_key, body, props in items:
                    self._channel.basic_publish(
                        exchange, routing_key, body, _to_pika(props), mandatory=mandatory
                    )
            except (pika.exceptions.AMQPError, OSError) as exc:
                raise translate_error(exc) from exc
            return
        if self.closed or not self._channel.is_open:
            raise ProtocolError("channel is closed")
        emit, body_max = output
        encode = self._transport.encoder.encode
        number = self.number
        try:
            data = b"".join(
                [
                    encode(
                        number,
                        exchange,
                        routing_key,
                        body,
                        props,
                        mandatory=mandatory,
                        body_max=body_max,
                    )
                    for exchange, routing_key, body, props in items
                ]
            )
        except (ValueError, TypeError, struct.error) as exc:
            raise ProtocolError(f"cannot encode a publish: {exc}") from exc
        try:
            emit(data)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise translate_error(exc) from exc

    def ack(self, tag: int, *, multiple: bool) -> None:
        """basic.ack (I/O thread only; ignored on a closed channel).

        Sent only after every basic.qos sent before it is confirmed: pika
        holds a second qos until the first one's qos-ok but sends acks at
        once, so an ack could otherwise reach the broker before a lower
        prefetch count and let it deliver more than the count allows.
        """
        if self._qos_pending:
            self._held_acks.append((tag, multiple))
        elif not self.closed and self._channel.is_open:
            self._channel.basic_ack(tag, multiple=multiple)

    def reject(self, tag: int, *, requeue: bool) -> None:
        """basic.reject (I/O thread only; ignored on a closed channel)."""
        if not self.closed and self._channel.is_open:
            self._channel.basic_reject(tag, requeue=requeue)

    def qos_nowait(self, prefetch_count: int) -> None:
        """basic.qos global=true without waiting (I/O thread only); acks sent
        after it wait for its qos-ok (see ``ack``)."""
        if not self.closed and self._channel.is_open:
            self._qos_pending += 1
            self._channel.basic_qos(
                prefetch_count=prefetch_count, global_qos=True, callback=self._on_qos_ok
            )

    def _on_qos_ok(self, _frame: Any) -> None:
        self._qos_pending = max(self._qos_pending - 1, 0)
        if self._qos_pending:
            return
        held, self._held_acks = self._held_acks, []
        for tag, multiple in held:
            self.ack(tag, multiple=multiple)


#: The Connection.Start server property by which a rabbitflow gateway answers.
GATEWAY_PROPERTY = "rabbitflow-gateway"
_direct_noted: set[tuple[str, int]] = set()
_direct_lock = threading.Lock()


def note_direct_rabbitmq(server_properties: object, host: str, port: int) -> bool:
    """Log once per address, at INFO, that a connection went straight to RabbitMQ
    (its Connection.Start has no :data:`GATEWAY_PROPERTY`): RabbitMQ's own
    connection blocking applies, but no per-queue flow control.  Returns
    whether it logged."""
    if isinstance(server_properties, dict) and GATEWAY_PROPERTY in server_properties:
        return False
    with _direct_lock:
        if (host, port) in _direct_noted:
            return False
        _direct_noted.add((host, port))
    get_logger().info(
        f"Connected straight to RabbitMQ at {host}:{port}, not through a rabbitflow "
        "gateway: per-queue flow control (qpid.flow_* thresholds) is not enforced",
        host=host,
        port=port,
    )
    return True


class PikaTransport:
    """One AMQP connection on its own I/O thread."""

    def __init__(
        self,
        url: str,
        listener: TransportListener,
        *,
        heartbeat: int = 30,
        connect_timeout: float = 10.0,
        name: str = "rabbitflow",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        try:
            params = pika.URLParameters(url)
        except (ValueError, TypeError) as exc:
            raise BrokerError(f"bad broker URL {url!r}: {exc}") from exc
        if params.ssl_options is not None:
            # The host name is needed to verify the broker's certificate.
            params.ssl_options = pika.SSLOptions(
                ssl_context or ssl.create_default_context(), server_hostname=params.host
            )
        params.heartbeat = heartbeat
        params.blocked_connection_timeout = None
        params.connection_attempts = 1
        params.socket_timeout = connect_timeout
        params.client_properties = {"connection_name": name}
        self._params = params
        self._listener = listener
        self._connect_timeout = connect_timeout
        self._connection: Any = None
        self._thread: threading.Thread | None = None
        self._name = name
        self.encoder = _PublishEncoder()
        self.closing = False
        self.lost = False
        self._opened = False

    def raw_output(self) -> tuple[Callable[[bytes], None], int] | None:
        """(write encoded frames, largest body frame payload) for the publish
        path, or None when pika's internals are not as expected."""
        connection = self._connection
        output = getattr(connection, "_output_marshaled_frames", None)
        body_max = getattr(connection, "_body_max_length", None)
        if output is None or not isinstance(body_max, int) or body_max <= 0:
            return None
        return (lambda data: output([data])), body_max

    @property
    def alive(self) -> bool:
        """True while the connection is open and not closing."""
        return not (self.closing or self.lost) and self._connection is not None

    def on_io_thread(self) -> bool:
        """True when called from the I/O thread."""
        return threading.current_thread() is self._thread

    def connect(self) -> None:
        """Open the connection and start the I/O thread.

        Raises:
            BrokerError: authentication / access refused, bad URL.
            ConnectionLostError: the broker cannot be reached.
        """
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()

        def on_open(conn: Any) -> None:
            _coalesce_writes(conn)
            self._opened = True
            params = self._params
            note_direct_rabbitmq(getattr(conn, "server_properties", None), params.host, params.port)
            opened.set_result(None)

        def on_open_error(_conn: Any, error: BaseException | str) -> None:
            exc = error if isinstance(error, BaseException) else ConnectionLostError(str(error))
            if not opened.done():
                opened.set_exception(translate_error(exc))
            self._connection.ioloop.stop()

        def on_closed(_conn: Any, reason: BaseException) -> None:
            was_closing = self.closing
            if opened.done() and not was_closing and not self.lost:
                self.lost = True
                error = translate_error(reason)
                lost = (
                    error
                    if isinstance(error, ConnectionLostError)
                    else ConnectionLostError(str(error))
                )
                self._listener.on_lost(lost)
            self._connection.ioloop.stop()

        connection = pika.SelectConnection(
            self._params,
            on_open_callback=on_open,
            on_open_error_callback=on_open_error,
            on_close_callback=on_closed,
        )
        connection.add_on_connection_blocked_callback(
            lambda _conn, frame: self._listener.on_blocked(str(frame.method.reason))
        )
        connection.add_on_connection_unblocked_callback(
            lambda _conn, _frame: self._listener.on_unblocked()
        )
        self._connection = connection
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-io", daemon=True)
        self._thread.start()
        try:
            opened.result(timeout=self._connect_timeout + 5)
        except concurrent.futures.TimeoutError:
            self.lost = True
            self.post(self._connection.close)
            raise ConnectionLostError(
                f"timed out connecting to {self._params.host}:{self._params.port}"
            ) from None
        except JMSException:
            self.lost = True
            raise

    def _run(self) -> None:
        try:
            self._connection.ioloop.start()
        except Exception as exc:  # a pika bug must not hang the application
            # Before the open completed, connect() reports the failure itself.
            if self._opened and not self.lost and not self.closing:
                self.lost = True
                self._listener.on_lost(ConnectionLostError(f"I/O loop failed: {exc!r}"))
        finally:
            # Releases the loop's wake-up socket pair.
            with contextlib.suppress(Exception):
                self._connection.ioloop.close()

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread soon (at once when already on it)."""
        if self.on_io_thread():
            fn()
            return
        # Loop gone: the connection is lost and recovery will run.
        with contextlib.suppress(RuntimeError, AttributeError, OSError, pika.exceptions.AMQPError):
            self._connection.ioloop.add_callback_threadsafe(fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread after ``delay`` seconds (from the I/O thread)."""
        self._connection.ioloop.call_later(delay, fn)

    def wait(
        self, future: concurrent.futures.Future[R], *, timeout: float | None = _RPC_TIMEOUT
    ) -> R:
        """Wait for an RPC result from another thread (``timeout`` None: as
        long as the connection lives).

        Raises:
            IllegalStateError: called on the I/O thread (would deadlock).
            ConnectionLostError: the connection died while waiting.
            ProtocolError: no answer within ``timeout`` seconds.
            JMSException: the RPC failed (translated).
        """
        if self.on_io_thread():
            raise IllegalStateError("blocking call on the rabbitflow I/O thread")
        remaining = timeout
        while True:
            if self.lost and not future.done():
                raise ConnectionLostError("connection lost")
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if remaining is not None:
                    remaining -= 0.2
                    if remaining <= 0:
                        raise ProtocolError(
                            f"the broker did not answer within {timeout:g} s"
                        ) from None

    def open_channel(self, handler: ChannelHandler) -> TransportChannel:
        """Open a channel whose events go to ``handler``.

        Raises:
            ConnectionLostError: the connection is gone.
            JMSException: the broker refused.
        """
        if not self.alive:
            raise ConnectionLostError("connection is not open")
        future: concurrent.futures.Future[TransportChannel] = concurrent.futures.Future()

        def run() -> None:
            try:
                self._connection.channel(
                    on_open_callback=lambda ch: future.set_result(
                        TransportChannel(self, ch, handler)
                    )
                )
            except Exception as exc:
                future.set_exception(translate_error(exc))

        self.post(run)
        return self.wait(future)

    def close(self) -> None:
        """Close the connection and stop the I/O thread (idempotent)."""
        if self.closing:
            return
        self.closing = True
        if not self.lost and self._connection is not None:

            def run() -> None:
                if self._connection.is_open:
                    self._connection.close()
                elif not self._connection.is_closed:
                    pass  # opening/closing already: on_closed stops the loop

            self.post(run)
        thread = self._thread
        if thread is not None and not self.on_io_thread():
            thread.join(timeout=10)
