"""rabbitflow_broker: an AMQP 0-9-1 gateway adding Qpid-style flow control to RabbitMQ.

Run it with ``rabbitflow-broker`` or embed it with :class:`GatewayService`.
"""

from rabbitflow_broker.config import ConfigError, GatewayConfig, load_config
from rabbitflow_broker.service import GatewayService

__version__ = "0.1.0"

__all__ = ["ConfigError", "GatewayConfig", "GatewayService", "__version__", "load_config"]
