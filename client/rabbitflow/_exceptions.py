"""The rabbitflow exception tree.

Branches follow what the caller can do about the failure; each also derives
from the builtin exception a Python caller would catch (in brackets)::

    JMSException                      every error raised by rabbitflow
    ├── ConnectionLostError           [ConnectionError] recovery gave up, or the
    │                                 broker cannot be reached; make a new connection
    ├── TLSError                      the TLS handshake failed (broker certificate
    │                                 not trusted, client certificate refused):
    │                                 fix the CA / certificate settings
    ├── FlowControlTimeoutError       [TimeoutError] send() waited too long under
    │                                 flow control; the message was not sent,
    │                                 retry later (a commit(): nothing was
    │                                 committed, the transaction stays open)
    ├── UnconfirmedMessagesError      close() could not get every sent message
    │                                 confirmed; ``unconfirmed`` says how many
    │                                 (they may still be enqueued)
    ├── BrokerError                   the broker refused an operation
    │   ├── ProtocolError             unexpected frame / channel or connection
    │   │                             closed by the broker
    │   ├── InvalidDestinationError   no such queue / exchange, or wrong type
    │   └── TransactionRolledBackError  commit could not complete
    ├── IllegalStateError             the object is closed or in the wrong mode
    │   └── StaleMessageError         acknowledge() of a message whose channel
    │                                 was lost: the broker delivers it again
    ├── MessageFormatError            [TypeError] a body or header of the wrong type,
    │                                 or one AMQP cannot carry (a string over 255
    │                                 bytes, an int over 64 bits); names the field
    └── InvalidPropertyError          [ValueError] a bad configuration property
                                      or argument; names the item
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ConnectionLostError",
    "FlowControlTimeoutError",
    "IllegalStateError",
    "InvalidDestinationError",
    "InvalidPropertyError",
    "JMSException",
    "MessageFormatError",
    "ProtocolError",
    "StaleMessageError",
    "TLSError",
    "TransactionRolledBackError",
    "UnconfirmedMessagesError",
]


class JMSException(Exception):
    """Root of every exception rabbitflow raises."""


class ConnectionLostError(JMSException, ConnectionError):
    """The connection to the broker was lost and recovery gave up (or the
    broker could not be reached at all).  Also a builtin ``ConnectionError``."""


class TLSError(JMSException):
    """The TLS handshake with the broker failed; the text says why (e.g.
    "TLS certificate verification failed: ...").  Retrying will not help."""


class FlowControlTimeoutError(JMSException, TimeoutError):
    """send() was held by broker flow control past the wait-failure time.

    The message was not sent.  Also a builtin ``TimeoutError``.  A
    transacted session's ``commit()`` raises it when flow control held a
    message of the transaction unpublished that long: nothing was committed.
    """


class UnconfirmedMessagesError(JMSException):
    """A producer's (or its session's / connection's) ``close()`` could not get
    every sent message confirmed: the wait reached
    ``qpid.flow_control_wait_failure``, or the connection failed.

    ``unconfirmed`` is how many; they may still be enqueued (the broker may
    have taken them without its confirm arriving in time).
    """

    def __init__(self, message: str, *, unconfirmed: int) -> None:
        super().__init__(message)
        self.unconfirmed = unconfirmed


class BrokerError(JMSException):
    """The broker refused an operation."""

    def __init__(self, message: str, *, reply_code: int | None = None) -> None:
        super().__init__(message)
        self.reply_code = reply_code


class ProtocolError(BrokerError):
    """The broker closed a channel or the connection, or sent something unexpected."""


class InvalidDestinationError(BrokerError):
    """A destination does not exist or cannot be used as asked."""


class TransactionRolledBackError(BrokerError):
    """A transacted session's commit could not complete; the work was rolled back."""


class IllegalStateError(JMSException):
    """The object is closed, or the call does not fit its mode."""


class StaleMessageError(IllegalStateError):
    """``acknowledge()`` of a message delivered on a channel that was lost since
    (connection recovery).  It was not acknowledged: the broker delivers it
    again (``redelivered`` set), so process it idempotently."""


class MessageFormatError(JMSException, TypeError):
    """A message body or header has the wrong type, or cannot be carried by
    AMQP (``send()`` refuses it before accepting it; the text names the field
    and the limit).  Also a builtin ``TypeError``."""


class InvalidPropertyError(JMSException, ValueError):
    """A configuration property or argument has a bad value; the text names it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
