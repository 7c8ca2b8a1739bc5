"""Re-exports the in-process gateway fixtures of ``integration/broker/conftest.py``."""

from integration.broker.conftest import (  # noqa: F401
    RunningGateway,
    gateway,
    gateway_factory,
    wait_for,
)
