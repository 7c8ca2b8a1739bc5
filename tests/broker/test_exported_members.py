"""The public surface of rabbitflow_broker is small and pinned."""

import rabbitflow_broker


def test_public_names() -> None:
    assert rabbitflow_broker.__all__ == [
        "ConfigError",
        "GatewayConfig",
        "GatewayService",
        "__version__",
        "load_config",
    ]
