"""What the transports share: the events they deliver, the handler
protocols, pika's properties and errors in rabbitflow's terms, and the
notice of a connection that bypasses the gateway.  Part of the pika
boundary (the ``_transport*`` modules are the only ones that import pika).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pika
import pika.exceptions

from ._endpoints import redact
from ._exceptions import (
    BrokerError,
    ConnectionLostError,
    InvalidDestinationError,
    JMSException,
    ProtocolError,
    TLSError,
)
from ._log import get_logger
from ._message import WireProperties

__all__ = [
    "DETACHED",
    "GATEWAY_PROPERTY",
    "RPC_TIMEOUT",
    "ChannelHandler",
    "Delivery",
    "TransportListener",
    "cancel_consumer",
    "connect_timed_out",
    "connection_parameters",
    "from_pika",
    "listen_blocked",
    "lost_error",
    "note_direct_rabbitmq",
    "open_failed",
    "to_pika",
    "translate_error",
]

_NOT_FOUND = 404
#: Seconds a channel RPC may wait for the broker's answer.
RPC_TIMEOUT = 30.0


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


DETACHED: ChannelHandler = _Detached()


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


def open_failed(error: BaseException | str) -> JMSException:
    """Why a connection could not be opened (pika's open-error callback argument)."""
    return translate_error(
        error if isinstance(error, BaseException) else ConnectionLostError(str(error))
    )


def lost_error(reason: BaseException) -> ConnectionLostError:
    """What a lost connection reports (pika's close reason, translated)."""
    error = translate_error(reason)
    return error if isinstance(error, ConnectionLostError) else ConnectionLostError(str(error))


def connect_timed_out(params: pika.ConnectionParameters) -> ConnectionLostError:
    """The error of a connection not open in time."""
    return ConnectionLostError(f"timed out connecting to {params.host}:{params.port}")


def listen_blocked(connection: Any, listener: TransportListener) -> None:
    """Pass a pika connection's connection.blocked / unblocked to ``listener``."""
    connection.add_on_connection_blocked_callback(
        lambda _conn, frame: listener.on_blocked(str(frame.method.reason))
    )
    connection.add_on_connection_unblocked_callback(lambda _conn, _frame: listener.on_unblocked())


def cancel_consumer(
    channel: Any, tag: str | None, usable: bool, on_ok: Callable[[], None] | None
) -> None:
    """basic.cancel of consumer ``tag`` on a pika channel without waiting;
    ``on_ok()`` at its cancel-ok, after which no delivery for it can come.

    Deliveries already on their way are rejected back to the queue by pika.
    With nothing to cancel (no tag, an unusable or closed channel, a consumer
    the broker cancelled) pika would never answer: ``on_ok()`` runs at once.
    """
    if tag is not None and usable and channel.is_open and tag in channel.consumer_tags:
        channel.basic_cancel(tag, callback=None if on_ok is None else lambda _frame: on_ok())
    elif on_ok is not None:
        on_ok()


def to_pika(props: WireProperties) -> pika.BasicProperties:
    """pika's properties for ``props``."""
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


def from_pika(props: pika.BasicProperties) -> WireProperties:
    """``props`` of pika in rabbitflow's terms."""
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


def connection_parameters(
    url: str,
    *,
    heartbeat: int,
    connect_timeout: float,
    name: str,
    tls: ssl.SSLContext | None,
) -> pika.URLParameters:
    """pika's parameters for one connection attempt to ``url`` (both transports).

    Raises:
        BrokerError: ``url`` is not a broker URL pika can use.
    """
    try:
        params = pika.URLParameters(url)
    except (ValueError, TypeError) as exc:
        raise BrokerError(f"bad broker URL {redact(url)!r}: {exc}") from exc
    if params.ssl_options is not None:
        # The host name is needed to verify the broker's certificate.
        params.ssl_options = pika.SSLOptions(
            tls or ssl.create_default_context(), server_hostname=params.host
        )
    params.heartbeat = heartbeat
    params.blocked_connection_timeout = None
    params.connection_attempts = 1
    params.socket_timeout = connect_timeout
    params.client_properties = {"connection_name": name}
    return params
