"""TLS for ``amqps://`` URLs: the ``ssl.SSLContext`` a connection uses.

Built once, when the ``ConnectionFactory`` is created, so a bad CA,
certificate or key fails there with an error that names the property.
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

from ._exceptions import InvalidPropertyError
from ._properties import ClientConfig

__all__ = ["is_tls_url", "tls_context"]


def is_tls_url(url: str) -> bool:
    """True for an ``amqps://`` URL."""
    return urlsplit(url).scheme.lower() == "amqps"


def tls_context(
    url: str, config: ClientConfig, ssl_context: ssl.SSLContext | None
) -> ssl.SSLContext | None:
    """The TLS context for ``url``: ``ssl_context`` when given, else one built
    from the ``rabbitflow.ssl.*`` properties (the system's CAs when none is
    set); None for an ``amqp://`` URL.

    Raises:
        InvalidPropertyError: TLS settings with an ``amqp://`` URL, or a CA,
            certificate or key file that cannot be loaded (the text names it).
    """
    if not is_tls_url(url):
        if ssl_context is not None:
            raise InvalidPropertyError("ssl_context", "needs an amqps:// URL")
        if config.uses_tls_files:
            raise InvalidPropertyError(
                "rabbitflow.ssl", "the rabbitflow.ssl.* properties need an amqps:// URL"
            )
        return None
    if ssl_context is not None:
        return ssl_context  # the most explicit source wins over the properties
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if config.ssl_ca_file is not None:
        try:
            context.load_verify_locations(cafile=config.ssl_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidPropertyError(
                "rabbitflow.ssl.ca_file", f"cannot load {config.ssl_ca_file!r}: {exc}"
            ) from exc
    if config.ssl_cert_file is not None:
        try:
            context.load_cert_chain(config.ssl_cert_file, config.ssl_key_file)
        except (ssl.SSLError, OSError) as exc:
            name = "rabbitflow.ssl.cert_file"
            if config.ssl_key_file is not None:
                name += " / rabbitflow.ssl.key_file"
            raise InvalidPropertyError(
                name, f"cannot load the client certificate and key: {exc}"
            ) from exc
    return context
