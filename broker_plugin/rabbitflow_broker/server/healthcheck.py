"""``python -m rabbitflow_broker.server.healthcheck [HOST:PORT]``: exit 0 when the
gateway answers an AMQP handshake (the container image's HEALTHCHECK).

The address defaults to ``$RABBITFLOW_BROKER_LISTEN`` (else
``127.0.0.1:5673``); a wildcard host (``0.0.0.0``, ``::``) is probed on
loopback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from rabbitflow_broker.hub.config import ConfigError, parse_host_port
from rabbitflow_broker.server.rabbitmq_node import amqp_handshake_ok

__all__ = ["main", "probe_address"]


def probe_address(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, int]:
    """The (host, port) to probe.

    Raises:
        ConfigError: a malformed address.
    """
    value = argv[0] if argv else environ.get("RABBITFLOW_BROKER_LISTEN", "127.0.0.1:5673")
    host, port = parse_host_port("listen", value)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1" if host != "::" else "::1"
    return host, port


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """0 when the gateway answers, 1 when it does not, 2 for a bad address."""
    try:
        host, port = probe_address(
            sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
        )
    except ConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 2
    if amqp_handshake_ok(host, port, timeout=3.0):
        return 0
    print(f"healthcheck: no AMQP answer at {host}:{port}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
