"""rabbitflow_broker: an AMQP 0-9-1 gateway adding Qpid-style flow control to RabbitMQ.

Run it with ``rabbitflow-broker`` or embed it with :class:`GatewayService`.
"""

from typing import TYPE_CHECKING, Any

# First: it chooses the compiled engine or its pure-Python sources.
from rabbitflow_broker import accel  # noqa: F401
from rabbitflow_broker.cli.config import ConfigError, GatewayConfig, load_config

if TYPE_CHECKING:
    from rabbitflow_broker.server.service import GatewayService

    #: The installed distribution's version: the same as ``rabbitflow.__version__``.
    __version__: str

__all__ = ["ConfigError", "GatewayConfig", "GatewayService", "__version__", "load_config"]


def __getattr__(name: str) -> Any:
    # The service (asyncio, aiohttp) loads on first use, so the pure modules
    # (the connection engine above all) import without an event loop library.
    if name == "GatewayService":
        from rabbitflow_broker.server.service import GatewayService

        return GatewayService
    if name == "__version__":
        # Read on first use: importlib.metadata imports socket, and the
        # engine's modules import no I/O library.
        from rabbitflow_broker.version import __version__

        return __version__
    raise AttributeError(f"module 'rabbitflow_broker' has no attribute {name!r}")
