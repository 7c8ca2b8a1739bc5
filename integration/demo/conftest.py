"""Re-export the in-process gateway fixtures of integration/broker.

The rabbitflow SDK (client/rabbitflow/_transport.py, PikaTransport.close)
stops pika's SelectConnection I/O loop without ``ioloop.close()``, so each
SDK connection leaks the loop's wake-up socket pair; the garbage collector
then reports "unclosed <socket.socket ...>" at random points of the session.
Until the SDK closes its loop, ignore exactly that report (and nothing else).
"""

import pytest

from integration.broker.conftest import gateway, gateway_factory

__all__ = ["gateway", "gateway_factory"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "filterwarnings",
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning",
    )
