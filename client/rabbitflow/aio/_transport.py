"""The asyncio transport: one AMQP connection on the application's event loop.

The only module of ``rabbitflow.aio`` that imports pika (its asyncio adapter).
Everything here runs on the loop that created the connection; pika's
callbacks arrive there too, so no locks are needed.  Frame encoding, error
translation, property conversion and pika's internals are shared with the
sync transport (``_transport_frames``, ``_transport_base``,
``_transport_patch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import struct
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.asyncio_connection import AsyncioConnection

from .._exceptions import ConnectionLostError, JMSException, ProtocolError
from .._message import WireProperties
from .._transport_base import (
    DETACHED,
    RPC_TIMEOUT,
    ChannelHandler,
    Delivery,
    TransportListener,
    cancel_consumer,
    connect_timed_out,
    connection_parameters,
    from_pika,
    listen_blocked,
    lost_error,
    open_failed,
    to_pika,
    translate_error,
)
from .._transport_frames import PublishEncoder
from .._transport_patch import marshaled_output

__all__ = ["AioChannel", "AioTransport", "settle"]


def settle(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` with None unless it is done already."""
    if not future.done():
        future.set_result(None)


class AioChannel:
    """One AMQP channel; its events go to ``handler`` on the loop."""

    def __init__(self, transport: AioTransport, channel: Any, handler: ChannelHandler) -> None:
        self._transport = transport
        self._channel = channel
        self._handler: ChannelHandler = handler
        self._pending: set[asyncio.Future[Any]] = set()
        self._consumer_tag: str | None = None
        self._qos_pending = 0
        self._held_acks: list[tuple[int, bool]] = []
        self.closing = False
        self.closed = False
        channel.add_on_close_callback(self._on_closed)
        channel.add_on_flow_callback(self._on_flow)
        channel.add_on_cancel_callback(self._on_cancel)

    def detach(self) -> None:
        """Stop passing this channel's events on (its connection was lost)."""
        self._handler = DETACHED

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
        by_broker = isinstance(reason, pika.exceptions.ChannelClosedByBroker)
        if by_broker and not self.closing and not self._transport.closing:
            self._handler.on_channel_closed(error)

    def _on_flow(self, frame_or_active: Any) -> None:
        method = getattr(frame_or_active, "method", frame_or_active)
        self._handler.on_flow(bool(getattr(method, "active", method)))

    def _on_cancel(self, _frame: Any) -> None:
        if not self.closing:
            from .._exceptions import InvalidDestinationError

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
                from_pika(props),
            )
        )

    # --------------------------------------------------------------- rpc
    async def _rpc(self, start: Callable[[Callable[[Any], None]], None]) -> Any:
        if self.closed or not self._channel.is_open:
            raise ProtocolError("channel is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.add(future)

        def done(result: Any = None) -> None:
            if not future.done():
                future.set_result(result)

        try:
            start(done)
        except (pika.exceptions.AMQPError, OSError) as exc:
            self._pending.discard(future)
            raise translate_error(exc) from exc
        try:
            async with asyncio.timeout(RPC_TIMEOUT):
                return await future
        except TimeoutError:
            raise ProtocolError(f"the broker did not answer within {RPC_TIMEOUT:g} s") from None
        finally:
            self._pending.discard(future)

    async def confirm_select(self) -> None:
        """Put the channel in confirm mode; confirms go to ``on_confirm``."""
        await self._rpc(lambda cb: self._channel.confirm_delivery(self._on_confirm, callback=cb))

    async def queue_declare(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> tuple[str, int, int]:
        """Declare a queue; returns (name, message count, consumer count).

        Raises:
            InvalidDestinationError: passive and the queue does not exist (the
                channel is then closed).
        """
        frame = await self._rpc(
            lambda cb: self._channel.queue_declare(
                name,
                passive=passive,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                callback=cb,
            )
        )
        method = frame.method
        return str(method.queue), int(method.message_count), int(method.consumer_count)

    async def exchange_declare(self, name: str, kind: str, *, passive: bool = False) -> None:
        """Declare a durable exchange."""
        await self._rpc(
            lambda cb: self._channel.exchange_declare(
                name, exchange_type=kind, durable=True, passive=passive, callback=cb
            )
        )

    async def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        """Bind ``queue`` to ``exchange``."""
        await self._rpc(
            lambda cb: self._channel.queue_bind(
                queue, exchange, routing_key=routing_key, callback=cb
            )
        )

    async def queue_delete(self, queue: str) -> None:
        """Delete ``queue``."""
        await self._rpc(lambda cb: self._channel.queue_delete(queue, callback=cb))

    async def close(self) -> None:
        """Close the channel (no error if it is already closed)."""
        if self.closed or self.closing:
            return
        self.closing = True
        if not self._transport.alive:
            return
        held, self._held_acks = self._held_acks, []
        self._qos_pending = 0
        for tag, multiple in held:
            self.ack(tag, multiple=multiple)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._channel.add_on_close_callback(lambda *_: settle(future))
        try:
            self._channel.close()
        except pika.exceptions.AMQPError:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RPC_TIMEOUT):
                await future

    # ------------------------------------------------- without waiting
    def publish_many(self, items: list[tuple[str, str, bytes, WireProperties]]) -> None:
        """basic.publish each of ``items`` (exchange, routing key, body,
        properties) in order, written to the connection's buffer at once.

        Raises:
            JMSException: the channel is closed (translated).
        """
        if self.closed or not self._channel.is_open:
            raise ProtocolError("channel is closed")
        output = self._transport.raw_output()
        if output is None:
            try:
                for exchange, routing_key, body, props in items:
                    self._channel.basic_publish(exchange, routing_key, body, to_pika(props))
            except (pika.exceptions.AMQPError, OSError) as exc:
                raise translate_error(exc) from exc
            return
        emit, body_max = output
        encode = self._transport.encoder.encode
        number = self.number
        try:
            data = b"".join(
                [
                    encode(number, ex, rk, body, props, mandatory=False, body_max=body_max)
                    for ex, rk, body, props in items
                ]
            )
        except (ValueError, TypeError, struct.error) as exc:
            raise ProtocolError(f"cannot encode a publish: {exc}") from exc
        try:
            emit(data)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise translate_error(exc) from exc

    def basic_consume_nowait(self, queue: str) -> None:
        """basic.consume without waiting for consume-ok."""
        if not self.closed and self._channel.is_open:
            self._consumer_tag = self._channel.basic_consume(
                queue, self._on_message, auto_ack=False
            )

    def basic_cancel_nowait(self, on_ok: Callable[[], None] | None = None) -> None:
        """basic.cancel of the consumer started by ``basic_consume_nowait``;
        ``on_ok()`` at its cancel-ok (see ``cancel_consumer``)."""
        tag, self._consumer_tag = self._consumer_tag, None
        cancel_consumer(self._channel, tag, not self.closed, on_ok)

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        """Passive queue.declare; ``on_depth(message_count)`` when it answers."""
        if not self.closed and self._channel.is_open:
            self._channel.queue_declare(
                queue, passive=True, callback=lambda frame: on_depth(frame.method.message_count)
            )

    def ack(self, tag: int, *, multiple: bool) -> None:
        """basic.ack, sent only after every earlier basic.qos is confirmed (a
        lower prefetch count must reach the broker before the ack that frees
        room)."""
        if self._qos_pending:
            self._held_acks.append((tag, multiple))
        elif not self.closed and self._channel.is_open:
            self._channel.basic_ack(tag, multiple=multiple)

    def qos_nowait(self, prefetch_count: int, on_ok: Callable[[], None] | None = None) -> None:
        """basic.qos global=true without waiting; later acks wait for its
        qos-ok; ``on_ok()`` runs at its qos-ok."""
        if not self.closed and self._channel.is_open:
            self._qos_pending += 1

            def qos_ok(frame: Any) -> None:
                self._on_qos_ok(frame)
                if on_ok is not None:
                    on_ok()

            self._channel.basic_qos(
                prefetch_count=prefetch_count,
                global_qos=True,
                callback=self._on_qos_ok if on_ok is None else qos_ok,
            )

    def _on_qos_ok(self, _frame: Any) -> None:
        self._qos_pending = max(self._qos_pending - 1, 0)
        if self._qos_pending:
            return
        held, self._held_acks = self._held_acks, []
        for tag, multiple in held:
            self.ack(tag, multiple=multiple)


class AioTransport:
    """One AMQP connection driven by the running asyncio loop."""

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
        self._params = connection_parameters(
            url, heartbeat=heartbeat, connect_timeout=connect_timeout, name=name, tls=ssl_context
        )
        self._listener = listener
        self._connect_timeout = connect_timeout
        self._connection: Any = None
        self.encoder = PublishEncoder()
        self.closing = False
        self.lost = False
        self._closed: asyncio.Future[None] | None = None

    @property
    def alive(self) -> bool:
        """True while the connection is open and not closing."""
        return not (self.closing or self.lost) and self._connection is not None

    def raw_output(self) -> tuple[Callable[[bytes], None], int] | None:
        """(write encoded frames, largest body frame payload), or None when
        pika's internals are not as expected."""
        return marshaled_output(self._connection)

    async def connect(self) -> None:
        """Open the connection on the running loop.

        Raises:
            BrokerError: authentication / access refused, bad URL.
            ConnectionLostError: the broker cannot be reached.
            TLSError: the TLS handshake failed.
        """
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        self._closed = loop.create_future()
        connection = AsyncioConnection(
            self._params,
            on_open_callback=lambda _conn: settle(opened),
            on_open_error_callback=functools.partial(self._on_open_error, opened),
            on_close_callback=functools.partial(self._on_closed, opened, self._closed),
            custom_ioloop=loop,
        )
        listen_blocked(connection, self._listener)
        self._connection = connection
        try:
            async with asyncio.timeout(self._connect_timeout + 5):
                await opened
        except TimeoutError:
            self.lost = True
            with contextlib.suppress(Exception):
                connection.close()
            raise connect_timed_out(self._params) from None
        except (JMSException, asyncio.CancelledError):
            self.lost = True
            with contextlib.suppress(Exception):
                connection.close()
            raise

    # pika's connection callbacks; ``opened`` is connect()'s.
    def _on_open_error(
        self, opened: asyncio.Future[None], _conn: Any, error: BaseException | str
    ) -> None:
        if not opened.done():
            opened.set_exception(open_failed(error))

    def _on_closed(
        self,
        opened: asyncio.Future[None],
        closed: asyncio.Future[None],
        _conn: Any,
        reason: BaseException,
    ) -> None:
        settle(closed)
        if opened.done() and not self.closing and not self.lost:
            self.lost = True
            self._listener.on_lost(lost_error(reason))

    async def open_channel(self, handler: ChannelHandler) -> AioChannel:
        """Open a channel whose events go to ``handler``.

        Raises:
            ConnectionLostError: the connection is gone.
        """
        if not self.alive:
            raise ConnectionLostError("connection is not open")
        future: asyncio.Future[AioChannel] = asyncio.get_running_loop().create_future()

        def opened(channel: Any) -> None:
            if not future.done():
                future.set_result(AioChannel(self, channel, handler))

        try:
            self._connection.channel(on_open_callback=opened)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise translate_error(exc) from exc
        closed = self._closed
        assert closed is not None
        waits: list[asyncio.Future[Any]] = [future, closed]
        await asyncio.wait(waits, timeout=RPC_TIMEOUT, return_when="FIRST_COMPLETED")
        if future.done() and not future.cancelled():
            return future.result()
        if not future.done():
            future.cancel()
        raise ConnectionLostError("the connection was lost while opening a channel")

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        if self.closing:
            return
        self.closing = True
        connection = self._connection
        if connection is None or self.lost:
            return
        if connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
        closed = self._closed
        if closed is not None and not connection.is_closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.shield(closed)
