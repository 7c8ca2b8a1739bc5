"""One AMQP channel of the sync transport (part of the pika boundary)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import struct
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pika
import pika.exceptions
import pika.spec

from ._exceptions import (
    InvalidDestinationError,
    JMSException,
    ProtocolError,
)
from ._message import WireProperties
from ._transport_base import (
    DETACHED,
    RPC_TIMEOUT,
    ChannelHandler,
    Delivery,
    cancel_consumer,
    from_pika,
    to_pika,
    translate_error,
)
from ._transport_frames import PublishEncoder

__all__ = ["ChannelIO", "TransportChannel"]

R = TypeVar("R")


class ChannelIO(Protocol):
    """What a channel needs from its connection's transport."""

    closing: bool
    lost: bool
    encoder: PublishEncoder

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread."""

    def wait(
        self, future: concurrent.futures.Future[R], *, timeout: float | None = RPC_TIMEOUT
    ) -> R:
        """Wait for an RPC result from another thread."""
        ...

    def raw_output(self) -> tuple[Callable[[bytes], None], int] | None:
        """(write encoded frames, largest body frame payload), or None."""


class TransportChannel:
    """One AMQP channel.  Blocking methods may be called from any thread but
    the I/O thread; ``publish``/``ack``/``reject``/``qos_nowait`` only on the
    I/O thread (inside ``PikaTransport.post``)."""

    def __init__(self, transport: ChannelIO, channel: Any, handler: ChannelHandler) -> None:
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
                from_pika(props),
            )
        )

    # --------------------------------------------------------------- rpc
    def _rpc(
        self,
        start: Callable[[Callable[[Any], None]], None],
        *,
        timeout: float | None = RPC_TIMEOUT,
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

    def basic_cancel_nowait(self, on_ok: Callable[[], None] | None = None) -> None:
        """basic.cancel of the consumer started by ``basic_consume_nowait`` (I/O
        thread only); ``on_ok()`` at its cancel-ok (see ``cancel_consumer``)."""
        tag, self._consumer_tag = self._consumer_tag, None
        cancel_consumer(self._channel, tag, not self.closed, on_ok)

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
                        exchange, routing_key, body, to_pika(props), mandatory=mandatory
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

    def qos_nowait(self, prefetch_count: int, on_ok: Callable[[], None] | None = None) -> None:
        """basic.qos global=true without waiting (I/O thread only); acks sent
        after it wait for its qos-ok (see ``ack``); ``on_ok()`` runs at its qos-ok."""
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
