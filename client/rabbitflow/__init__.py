"""rabbitflow: a JMS-like RabbitMQ client whose send() honours broker flow control.

>>> import rabbitflow
>>> with rabbitflow.ConnectionFactory().create_connection() as connection:
...     session = connection.create_session()
...     producer = session.create_producer(session.create_queue("orders"))
...     producer.send(session.create_text_message("hello"))
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version

from ._connection import Connection, ConnectionFactory
from ._consumer import MessageConsumer
from ._consumer_flow import ConsumerFlowStats
from ._destination import Destination, Queue, Topic
from ._exceptions import (
    BrokerError,
    ConnectionLostError,
    FlowControlTimeoutError,
    IllegalStateError,
    InvalidDestinationError,
    InvalidPropertyError,
    JMSException,
    MessageFormatError,
    ProtocolError,
    StaleMessageError,
    TLSError,
    TransactionRolledBackError,
    UnconfirmedMessagesError,
)
from ._log import LOGGER_NAME, json_formatter
from ._message import NON_PERSISTENT, PERSISTENT, BytesMessage, Message, TextMessage
from ._producer import MessageProducer
from ._properties import ClientConfig
from ._session import Session
from ._session_core import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    SESSION_TRANSACTED,
)
from ._system import system_properties

__all__ = [
    "AUTO_ACKNOWLEDGE",
    "CLIENT_ACKNOWLEDGE",
    "DUPS_OK_ACKNOWLEDGE",
    "LOGGER_NAME",
    "NON_PERSISTENT",
    "PERSISTENT",
    "SESSION_TRANSACTED",
    "BrokerError",
    "BytesMessage",
    "ClientConfig",
    "Connection",
    "ConnectionFactory",
    "ConnectionLostError",
    "ConsumerFlowStats",
    "Destination",
    "FlowControlTimeoutError",
    "IllegalStateError",
    "InvalidDestinationError",
    "InvalidPropertyError",
    "JMSException",
    "Message",
    "MessageConsumer",
    "MessageFormatError",
    "MessageProducer",
    "ProtocolError",
    "Queue",
    "Session",
    "StaleMessageError",
    "TLSError",
    "TextMessage",
    "Topic",
    "TransactionRolledBackError",
    "UnconfirmedMessagesError",
    "__version__",
    "json_formatter",
    "system_properties",
]

try:
    #: The installed distribution's version (one source: pyproject.toml).
    __version__: str = _dist_version("rabbitflow")
except _PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
