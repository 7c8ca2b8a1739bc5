"""Client properties: names, defaults, sources and validation (pure).

Sources, later wins: the defaults below; ``-Dname=value`` tokens of the
environment variable ``RABBITFLOW_OPTS``; the process-wide mutable mapping
``rabbitflow.system_properties`` (seeded from ``RABBITFLOW_OPTS`` at import);
the ``properties`` given to ``ConnectionFactory``.  ``ClientConfig.resolve``
merges them and validates every value, so a bad value fails when the factory
is created, with an error that names the property.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._exceptions import InvalidPropertyError

__all__ = [
    "ENV_OPTS",
    "ENV_URL",
    "PROPERTY_SPECS",
    "ClientConfig",
    "parse_opts",
    "read_environment",
]

ENV_OPTS = "RABBITFLOW_OPTS"
ENV_URL = "RABBITFLOW_URL"
DEFAULT_URL = "amqp://guest:guest@localhost:5672/%2F"

# Names whose prefix we own: an unknown name with one of them is a typo.
_OWNED_PREFIXES = ("qpid.", "imq", "rabbitflow.")


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One property: its name, the config field it sets, default and bounds."""

    name: str
    field: str
    default: int | bool | None
    kind: type  # int, bool or str (a file path)
    minimum: int = 0
    maximum: int | None = None
    doc: str = ""


PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    PropertySpec(
        "qpid.flow_control_wait_failure",
        "wait_failure_ms",
        60000,
        int,
        doc="longest a send waits under flow control (ms); 0 = raise at once",
    ),
    PropertySpec(
        "qpid.flow_control_wait_notify_period",
        "notify_period_ms",
        5000,
        int,
        doc="period of the 'delayed' warning (ms); 0 = no warnings",
    ),
    PropertySpec(
        "rabbitflow.producer_capacity",
        "producer_capacity",
        100,
        int,
        minimum=1,
        doc="default producer capacity (unconfirmed sends)",
    ),
    PropertySpec(
        "imqConsumerFlowLimit",
        "consumer_flow_limit",
        1000,
        int,
        minimum=1,
        doc="messages delivered to a consumer ahead of the application",
    ),
    PropertySpec(
        "imqConsumerFlowThreshold",
        "consumer_flow_threshold",
        50,
        int,
        maximum=100,
        doc="ask for the next batch once the buffer is down to this % of the limit",
    ),
    PropertySpec(
        "imqConnectionFlowLimitEnabled",
        "connection_flow_limit_enabled",
        False,
        bool,
        doc="enforce imqConnectionFlowLimit",
    ),
    PropertySpec(
        "imqConnectionFlowLimit",
        "connection_flow_limit",
        1000,
        int,
        minimum=1,
        doc="messages buffered for all consumers of one connection",
    ),
    PropertySpec(
        "rabbitflow.reconnect_attempts",
        "reconnect_attempts",
        30,
        int,
        doc="connection attempts after a loss before giving up; 0 = do not reconnect",
    ),
    PropertySpec(
        "rabbitflow.reconnect_timeout",
        "reconnect_timeout_ms",
        120000,
        int,
        doc="longest time spent reconnecting before giving up (ms)",
    ),
    PropertySpec(
        "rabbitflow.reconnect_initial_delay",
        "reconnect_initial_delay_ms",
        200,
        int,
        doc="first delay between reconnection attempts (ms), doubled each time",
    ),
    PropertySpec(
        "rabbitflow.reconnect_max_delay",
        "reconnect_max_delay_ms",
        5000,
        int,
        doc="longest delay between reconnection attempts (ms)",
    ),
    PropertySpec(
        "rabbitflow.nack_backoff_initial",
        "nack_backoff_initial_ms",
        50,
        int,
        minimum=1,
        doc="first delay before re-sending a nacked message (ms), doubled per nack",
    ),
    PropertySpec(
        "rabbitflow.nack_backoff_max",
        "nack_backoff_max_ms",
        1000,
        int,
        minimum=1,
        doc="longest delay before re-sending a nacked message (ms)",
    ),
    PropertySpec(
        "rabbitflow.ssl.ca_file",
        "ssl_ca_file",
        None,
        str,
        doc="PEM file of the CAs that sign the broker's certificate (amqps:// only; "
        "default: the system's CAs)",
    ),
    PropertySpec(
        "rabbitflow.ssl.cert_file",
        "ssl_cert_file",
        None,
        str,
        doc="PEM file of the client certificate (amqps:// only)",
    ),
    PropertySpec(
        "rabbitflow.ssl.key_file",
        "ssl_key_file",
        None,
        str,
        doc="PEM file of the client certificate's private key (amqps:// only)",
    ),
    PropertySpec(
        "rabbitflow.heartbeat",
        "heartbeat_s",
        30,
        int,
        doc="AMQP heartbeat (s) asked of the broker; 0 = off",
    ),
)

_BY_NAME = {spec.name: spec for spec in PROPERTY_SPECS}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_opts(opts: str) -> dict[str, str]:
    """Parse ``-Dname=value`` tokens (shell-quoted, like JAVA_OPTS).

    Tokens that are not ``-D`` definitions are ignored, as the JVM ignores
    options it is not asked about; ``-Dname`` without a value means "true".

    Raises:
        InvalidPropertyError: the text cannot be split (unbalanced quotes).
    """
    try:
        tokens = shlex.split(opts)
    except ValueError as exc:
        raise InvalidPropertyError(ENV_OPTS, f"cannot parse {opts!r}: {exc}") from exc
    result: dict[str, str] = {}
    for token in tokens:
        if not token.startswith("-D") or len(token) == 2:
            continue
        name, sep, value = token[2:].partition("=")
        result[name] = value if sep else "true"
    return result


def read_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The properties of ``RABBITFLOW_OPTS``; the one place the environment is read.

    Raises:
        InvalidPropertyError: the variable cannot be parsed.
    """
    env = os.environ if environ is None else environ
    return parse_opts(env.get(ENV_OPTS, ""))


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """``$RABBITFLOW_URL``, else the local broker with guest credentials."""
    env = os.environ if environ is None else environ
    return env.get(ENV_URL) or DEFAULT_URL


def _convert(spec: PropertySpec, value: Any) -> int | bool | str:
    if spec.kind is str:
        if not isinstance(value, str | os.PathLike) or not str(os.fspath(value)).strip():
            raise InvalidPropertyError(spec.name, f"expected a file path, got {value!r}")
        path = str(os.fspath(value)).strip()
        if not os.path.isfile(path):
            raise InvalidPropertyError(spec.name, f"no such file: {path!r}")
        return path
    if spec.kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise InvalidPropertyError(spec.name, f"expected true or false, got {value!r}")
    if isinstance(value, bool):
        raise InvalidPropertyError(spec.name, f"expected a number, got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise InvalidPropertyError(
                spec.name, f"expected a whole number, got {value!r}"
            ) from None
    if number < spec.minimum:
        raise InvalidPropertyError(
            spec.name,
            f"must be at least {spec.minimum}, got {number}"
            if spec.minimum
            else f"must not be negative, got {number}",
        )
    if spec.maximum is not None and number > spec.maximum:
        raise InvalidPropertyError(spec.name, f"must be at most {spec.maximum}, got {number}")
    return number


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientConfig:
    """Validated, immutable client configuration (see ``PROPERTY_SPECS``)."""

    wait_failure_ms: int = 60000
    notify_period_ms: int = 5000
    producer_capacity: int = 100
    consumer_flow_limit: int = 1000
    consumer_flow_threshold: int = 50
    connection_flow_limit_enabled: bool = False
    connection_flow_limit: int = 1000
    reconnect_attempts: int = 30
    reconnect_timeout_ms: int = 120000
    reconnect_initial_delay_ms: int = 200
    reconnect_max_delay_ms: int = 5000
    nack_backoff_initial_ms: int = 50
    nack_backoff_max_ms: int = 1000
    heartbeat_s: int = 30
    ssl_ca_file: str | None = None
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None

    @classmethod
    def resolve(cls, *sources: Mapping[str, Any] | None) -> ClientConfig:
        """Merge property sources (later wins) over the defaults and validate.

        Names outside the ``qpid.``, ``imq`` and ``rabbitflow.`` families are
        ignored (like unrelated JVM system properties).

        Raises:
            InvalidPropertyError: a value is not a number / boolean, is out of
                range, or a ``qpid.``/``imq``/``rabbitflow.`` name is unknown.
        """
        values: dict[str, int | bool | str] = {}
        for source in sources:
            for name, raw in (source or {}).items():
                spec = _BY_NAME.get(name)
                if spec is None:
                    if name.startswith(_OWNED_PREFIXES):
                        raise InvalidPropertyError(name, "unknown property")
                    continue
                values[spec.field] = _convert(spec, raw)
        if "ssl_key_file" in values and "ssl_cert_file" not in values:
            raise InvalidPropertyError(
                "rabbitflow.ssl.key_file", "needs rabbitflow.ssl.cert_file (the certificate)"
            )
        return cls(**values)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> ClientConfig:
        """A copy with ``changes`` applied (field names, not property names)."""
        return dataclasses.replace(self, **changes)

    @property
    def uses_tls_files(self) -> bool:
        """True when any ``rabbitflow.ssl.*`` property is set."""
        return any((self.ssl_ca_file, self.ssl_cert_file, self.ssl_key_file))

    def as_properties(self) -> dict[str, int | bool | str | None]:
        """The configuration as a property-name mapping."""
        return {spec.name: getattr(self, spec.field) for spec in PROPERTY_SPECS}

    @property
    def consumer_threshold_count(self) -> int:
        """Buffered-message count at or below which the next batch is asked for."""
        return self.consumer_flow_limit * self.consumer_flow_threshold // 100
