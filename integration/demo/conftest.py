"""Re-export the in-process gateway fixtures of integration/broker."""

from integration.broker.conftest import gateway, gateway_factory

__all__ = ["gateway", "gateway_factory"]
