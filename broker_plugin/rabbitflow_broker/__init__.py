"""rabbitflow_broker: an AMQP 0-9-1 gateway that adds Qpid-style producer flow control to RabbitMQ."""

__version__ = "0.1.0"
