"""Messages: text and bytes bodies, application properties, JMS headers,
and their mapping to and from AMQP 0-9-1 basic properties (pure)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._destination import Destination, Queue, TemporaryQueue, Topic
from ._exceptions import IllegalStateError, MessageFormatError

__all__ = [
    "NON_PERSISTENT",
    "PERSISTENT",
    "REDELIVERED_HEADER",
    "BytesMessage",
    "Message",
    "TextMessage",
    "WireProperties",
    "check_sendable",
    "flagged_redelivered",
    "new_message_id",
]

NON_PERSISTENT = 1
PERSISTENT = 2
_TEXT = "text/plain"
_BYTES = "application/octet-stream"
_TIMESTAMP_HEADER = "JMSTimestamp"  # ms precision; AMQP's timestamp has seconds only
# Set on a message re-published after a connection loss (its confirm was
# lost, so the broker may hold it twice); a receiver sees ``redelivered``.
REDELIVERED_HEADER = "JMSRedelivered"
_PropertyValue = str | int | float | bool | None
# What AMQP can carry (the publish encoder raises on anything else, and by
# then the message holds a delivery tag): short strings of at most 255 bytes,
# table integers of at most 64 bits.
_SHORT_MAX = 255
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


# uuid4() reads os.urandom for every id, a syscall that costs more than the
# rest of send(); a random 128-bit draw from a generator seeded from urandom
# (and reseeded in forked children) is as unique for message ids.
_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def flagged_redelivered(props: WireProperties) -> WireProperties:
    """``props`` with the header that makes a receiver see ``redelivered``."""
    headers = dict(props.headers or {})
    headers[REDELIVERED_HEADER] = True
    # headers is the third field; mypy types a concatenation of the slices
    # field by field, but not the same slices unpacked into a call.
    return WireProperties(*(props[:2] + (headers,) + props[3:]))  # noqa: RUF005


def new_message_id() -> str:
    """A fresh JMSMessageID: ``ID:<random uuid4>``."""
    h = f"{_rng.getrandbits(128):032x}"
    variant = "89ab"[int(h[16], 16) & 3]
    return f"ID:{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


class WireProperties(NamedTuple):
    """AMQP basic properties, independent of any client library (a named
    tuple: one is built per send, and a tuple is several times cheaper to
    build than a frozen dataclass)."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None


def destination_from_text(text: str | None) -> Destination | None:
    """Parse ``queue://x`` / ``topic://x`` (a bare name is a queue)."""
    if not text:
        return None
    for prefix, kind in (
        ("queue://", Queue),
        ("topic://", Topic),
        ("temp-queue://", TemporaryQueue),
    ):
        if text.startswith(prefix):
            return kind(text[len(prefix) :])
    return Queue(text)


@dataclass(eq=False)
class Message:
    """A message: body, application ``properties`` and JMS headers.

    Headers set by ``send()``: ``message_id``, ``timestamp`` (ms since the
    epoch), ``destination``, ``delivery_mode``, ``priority``, ``expiration``
    (ms since the epoch, 0 = never).  Set on receive: ``redelivered``.
    """

    properties: dict[str, _PropertyValue] = field(default_factory=dict)
    message_id: str | None = None
    timestamp: int = 0
    correlation_id: str | None = None
    reply_to: Destination | None = None
    type: str | None = None
    redelivered: bool = False
    destination: Destination | None = None
    delivery_mode: int = PERSISTENT
    priority: int = 4
    expiration: int = 0
    _acknowledger: Callable[[], None] | None = field(default=None, repr=False)

    def body_bytes(self) -> bytes:
        """The body as bytes on the wire."""
        raise NotImplementedError

    def set_property(self, name: str, value: _PropertyValue) -> None:
        """Set an application property.

        A float cannot be sent (the AMQP encoder this client uses has no
        floating-point header type): send it as a str, or scaled to an int.

        Raises:
            MessageFormatError: the name is empty or the value not str/int/bool/None.
        """
        if not isinstance(name, str) or not name:
            raise MessageFormatError(f"property name must be a non-empty string, got {name!r}")
        if value is not None and not isinstance(value, str | int | bool):
            raise MessageFormatError(
                f"property {name!r}: value must be str, int, bool or None, "
                f"got {type(value).__name__}"
            )
        self.properties[name] = value

    def get_property(self, name: str, default: _PropertyValue = None) -> _PropertyValue:
        """An application property, or ``default``."""
        return self.properties.get(name, default)

    def acknowledge(self) -> None:
        """Acknowledge every message consumed so far by this message's session.

        Only has an effect in CLIENT_ACKNOWLEDGE sessions (as in JMS).

        Raises:
            IllegalStateError: the session is closed.
        """
        if self._acknowledger is not None:
            self._acknowledger()

    # ------------------------------------------------------------- wire
    def to_wire(self) -> WireProperties:
        """AMQP properties for this message (headers set by ``send()`` included)."""
        headers: dict[str, Any] | None = None
        if self.properties:
            headers = dict(self.properties)
        if self.timestamp % 1000:
            # AMQP's timestamp has whole seconds; keep JMS's milliseconds in a
            # header (only when there are any: an empty table costs nothing).
            headers = headers if headers is not None else {}
            headers[_TIMESTAMP_HEADER] = self.timestamp
        ttl = self.expiration - self.timestamp if self.expiration else 0
        text = isinstance(self, TextMessage)
        # Positional, in field order: a named tuple built from keywords costs
        # twice as much, and one is built per send.
        return WireProperties(
            _TEXT if text else _BYTES,  # content_type
            "utf-8" if text else None,  # content_encoding
            headers,
            self.delivery_mode,
            self.priority,
            self.correlation_id,
            str(self.reply_to) if self.reply_to is not None else None,  # reply_to
            str(max(ttl, 1)) if self.expiration else None,  # expiration
            self.message_id,
            self.timestamp // 1000 if self.timestamp else None,  # timestamp
            self.type,
        )

    @staticmethod
    def from_wire(
        body: bytes,
        props: WireProperties,
        *,
        redelivered: bool,
        destination: Destination | None,
        acknowledger: Callable[[], None] | None = None,
    ) -> Message:
        """Build the message a consumer receives.

        Raises:
            MessageFormatError: a text message whose body is not valid in its encoding.
        """
        headers = dict(props.headers or {})
        ts_ms = headers.pop(_TIMESTAMP_HEADER, None)
        resent = headers.pop(REDELIVERED_HEADER, None) is True
        timestamp = int(ts_ms) if isinstance(ts_ms, int) else (props.timestamp or 0) * 1000
        message: Message
        if props.content_type == _TEXT:
            try:
                message = TextMessage(body.decode(props.content_encoding or "utf-8"))
            except (UnicodeDecodeError, LookupError) as exc:
                raise MessageFormatError(f"text message body cannot be decoded: {exc}") from exc
        else:
            message = BytesMessage(body)
        message.properties = {
            k: (v.decode() if isinstance(v, bytes) else v)
            for k, v in headers.items()
            if v is None or isinstance(v, str | int | float | bool | bytes)
        }
        message.message_id = props.message_id
        message.timestamp = timestamp
        message.correlation_id = props.correlation_id
        message.reply_to = destination_from_text(props.reply_to)
        message.type = props.type
        message.redelivered = redelivered or resent
        message._acknowledger = acknowledger
        message.destination = destination
        message.delivery_mode = props.delivery_mode or NON_PERSISTENT
        message.priority = props.priority if props.priority is not None else 4
        if props.expiration and timestamp:
            message.expiration = timestamp + int(props.expiration)
        return message


class TextMessage(Message):
    """A message whose body is text (UTF-8 on the wire)."""

    def __init__(self, text: str = "", **headers: Any) -> None:
        if not isinstance(text, str):
            raise MessageFormatError(f"text message body must be str, got {type(text).__name__}")
        Message.__init__(self, **headers)
        self.text = text

    def __repr__(self) -> str:
        return f"TextMessage(message_id={self.message_id!r}, text={self.text[:40]!r})"

    def body_bytes(self) -> bytes:
        """The body, UTF-8 encoded."""
        return self.text.encode("utf-8")


class BytesMessage(Message):
    """A message whose body is bytes."""

    def __init__(self, data: bytes = b"", **headers: Any) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MessageFormatError(f"bytes message body must be bytes, got {type(data).__name__}")
        Message.__init__(self, **headers)
        self.data = bytes(data)

    def __repr__(self) -> str:
        return f"BytesMessage(message_id={self.message_id!r}, {len(self.data)} bytes)"

    def body_bytes(self) -> bytes:
        """The body."""
        return self.data


def check_sendable(message: Message) -> None:
    """Refuse a message whose headers or properties AMQP cannot carry.

    On the send path: lengths, types and ranges only (a short string is
    encoded only when it is not ASCII; property values never are).

    Raises:
        MessageFormatError: ``correlation_id``, ``type``, ``reply_to`` or a
            property name that is not a string of at most 255 UTF-8 bytes; a
            property value that is not str, int, bool or None (AMQP headers
            from this client carry no floats), or an int outside 64 bits.
    """
    if message.correlation_id is not None:
        _check_short("correlation_id", message.correlation_id)
    if message.type is not None:
        _check_short("type", message.type)
    if message.reply_to is not None:
        _check_short("reply_to", str(message.reply_to))
    for name, value in message.properties.items():
        _check_short("property name", name)
        if isinstance(value, int):  # bool too
            if not _INT_MIN <= value <= _INT_MAX:
                raise MessageFormatError(
                    f"property {name!r}: {value} is outside the AMQP integer range "
                    "-2**63 .. 2**63-1"
                )
        elif value is not None and not isinstance(value, str):
            raise MessageFormatError(
                f"property {name!r}: a value of type {type(value).__name__} cannot be "
                "sent; AMQP headers from this client carry str, int, bool or None"
            )


def _check_short(field: str, text: object) -> None:
    if not isinstance(text, str):
        raise MessageFormatError(f"{field} must be a str, got {type(text).__name__}")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise MessageFormatError(f"{field} is not valid text: {exc}") from exc
    if size > _SHORT_MAX:
        raise MessageFormatError(
            f"{field} is {size} bytes in UTF-8, over AMQP's limit of {_SHORT_MAX}: {text[:40]!r}..."
        )


def check_open(closed: bool, what: str) -> None:
    """Raise IllegalStateError if ``closed``.

    Raises:
        IllegalStateError: the object is closed.
    """
    if closed:
        raise IllegalStateError(f"{what} is closed")
