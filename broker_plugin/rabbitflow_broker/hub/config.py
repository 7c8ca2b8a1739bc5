"""The gateway's settings: one immutable, validated :class:`GatewayConfig`.

Every layer reads them, the hub first (its defaults and limits), so they sit
here; :mod:`rabbitflow_broker.cli.config` builds them from their sources
(defaults, a TOML file, the environment, the command line).  A bad value
raises :class:`ConfigError` naming the option.  Every duration is in
milliseconds.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from rabbitflow_broker.engine.errors import UsageError

__all__ = [
    "LOG_LEVELS",
    "MAX_WORKERS",
    "ConfigError",
    "GatewayConfig",
    "parse_host_port",
    "without_password",
]

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(UsageError, ValueError):
    """An option has a bad value; the message names the option."""


def parse_host_port(option: str, value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` for IPv6).

    Raises:
        ConfigError: malformed value or port out of range.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--{option}: expected HOST:PORT, got {value!r}")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ConfigError(f"--{option}: port {number} out of range")
    return host.strip("[]") or "0.0.0.0", number


#: The most ``--workers`` (processes on one host; more than cores helps nothing).
MAX_WORKERS = 256

_CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Validated gateway options (see ``rabbitflow-broker --help``).

    Raises:
        ConfigError: on creation, for a bad value, naming the option.
    """

    listen: str = "127.0.0.1:5673"
    upstream: str = "amqp://localhost:5672"
    management_url: str = "http://localhost:15672"
    admin_listen: str = "127.0.0.1:15673"
    default_flow_stop_threshold: int = 80
    default_flow_resume_threshold: int = 70
    default_queue_limit: int = 104_857_600
    store_overfull_size: int = 0
    store_underfull_size: int = 0
    flow_enforcement_timeout: int = 5000
    #: Milliseconds a client may take from connecting to Connection.Open-Ok.
    handshake_timeout: int = 10_000
    event_log: str | None = None
    #: Rotate the event log before it passes this many bytes (0: never).
    event_log_max_bytes: int = 0
    #: Rotated event logs kept (PATH.1 .. PATH.N).
    event_log_keep: int = 5
    #: Rotate the event log after this many seconds (0: never).
    event_log_max_age: int = 0
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    state_file: str | None = None
    reconcile_interval: int = 1000
    #: Milliseconds between passive declares of flowed and nearly full queues.
    depth_poll_interval: int = 250
    routing_refresh_interval: int = 30_000
    store_path: str | None = None
    store_poll_interval: int = 1000
    admin_users: str | None = None
    #: ``none``, ``users`` or ``rabbitmq``; None resolves to ``users`` when
    #: ``admin_users`` is set, else ``none``.
    admin_auth: Literal["none", "users", "rabbitmq"] | None = None
    #: Extra names the admin API answers to in ``Host`` (comma-separated).
    admin_allowed_hosts: str | None = None
    listen_backlog: int = 1024
    #: Milliseconds SIGTERM waits for in-flight confirms before closing clients.
    drain_timeout: int = 10_000
    listen_tls: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    upstream_ca: str | None = None
    #: Share one flow state with the other gateways started with this name.
    cluster: str | None = None
    #: Messages one member may accept for a queue before the owner hears of them.
    cluster_batch: int = 100
    #: Milliseconds a grant (and an owner's silence) may last.
    cluster_lease: int = 2000
    #: Gateway processes on the listen address(es) (SO_REUSEPORT), one cluster.
    workers: int = 1
    #: Microseconds the event loop sleeps after reading a client that keeps a
    #: deep pipe of messages (0: no read pause, and no yield either).
    read_pause_us: int = 100

    def __post_init__(self) -> None:
        if self.listen.strip().lower() != "none":
            parse_host_port("listen", self.listen)
        elif not self.listen_tls:
            raise ConfigError("--listen none: needs --listen-tls, or nothing would be served")
        self._check_tls()
        admin_host, _ = parse_host_port("admin-listen", self.admin_listen)
        self._check_admin_auth(admin_host)
        for name in (
            "default_flow_stop_threshold",
            "default_flow_resume_threshold",
            "default_queue_limit",
            "store_overfull_size",
            "store_underfull_size",
            "flow_enforcement_timeout",
            "handshake_timeout",
            "reconcile_interval",
            "depth_poll_interval",
            "routing_refresh_interval",
            "store_poll_interval",
            "listen_backlog",
            "drain_timeout",
            "event_log_max_bytes",
            "event_log_keep",
            "event_log_max_age",
            "cluster_batch",
            "cluster_lease",
            "workers",
            "read_pause_us",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: must be a non-negative integer, got {value!r}"
                )
        if self.event_log_keep < 1:
            raise ConfigError("--event-log-keep: must be at least 1")
        if self.cluster is not None and not _CLUSTER_NAME.fullmatch(self.cluster):
            raise ConfigError(
                f"--cluster: letters, digits, '-', '_' and '.' only (1-64), got {self.cluster!r}"
            )
        if self.cluster_batch < 1:
            raise ConfigError("--cluster-batch: must be at least 1")
        if self.cluster_lease < 200:
            raise ConfigError("--cluster-lease: must be at least 200 ms")
        self._check_workers()
        for name in ("default_flow_stop_threshold", "default_flow_resume_threshold"):
            if getattr(self, name) > 100:
                raise ConfigError(f"--{name.replace('_', '-')}: a percentage cannot exceed 100")
        if self.default_flow_resume_threshold > self.default_flow_stop_threshold:
            raise ConfigError(
                "--default-flow-resume-threshold: must not be above --default-flow-stop-threshold"
            )
        if self.store_underfull_size > self.store_overfull_size:
            raise ConfigError(
                f"--store-overfull-size {self.store_overfull_size:,} is below "
                f"--store-underfull-size {self.store_underfull_size:,}: producers blocked "
                "by the store quota could never resume (set overfull >= underfull; 0 = off)"
            )
        upstreams = _split_urls(self.upstream)
        if not upstreams:
            raise ConfigError("--upstream: expected one or more amqp:// URLs, got none")
        for url in upstreams:
            if _split_url("upstream", url).scheme not in ("amqp", "amqps"):
                raise ConfigError(f"--upstream: expected an amqp:// URL, got {url!r}")
        if len({urlsplit(url).scheme for url in upstreams}) > 1:
            raise ConfigError("--upstream: the nodes must all be amqp:// or all amqps://")
        for url in _split_urls(self.management_url):
            if _split_url("management-url", url).scheme not in ("http", "https"):
                raise ConfigError(f"--management-url: expected an http(s):// URL, got {url!r}")
        if self.upstream_ca and not self.upstream_tls:
            raise ConfigError("--upstream-ca: only used with an amqps:// --upstream")
        if self.listen_backlog < 1:
            raise ConfigError("--listen-backlog: must be at least 1")
        if self.log_format not in ("console", "json"):
            raise ConfigError(f"--log-format: expected console or json, got {self.log_format!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"--log-level: expected one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        if self.event_loop not in ("auto", "asyncio", "uvloop"):
            raise ConfigError(
                f"--event-loop: expected auto, asyncio or uvloop, got {self.event_loop!r}"
            )

    def _check_tls(self) -> None:
        if self.listen_tls:
            parse_host_port("listen-tls", self.listen_tls)
            if not self.tls_cert or not self.tls_key:
                raise ConfigError("--listen-tls: needs --tls-cert PEM and --tls-key PEM")
        elif self.tls_cert or self.tls_key or self.tls_client_ca:
            raise ConfigError("--tls-cert/--tls-key/--tls-client-ca: only used with --listen-tls")
        for option in ("tls_cert", "tls_key", "tls_client_ca", "upstream_ca"):
            path = getattr(self, option)
            if path and not os.path.isfile(path):
                raise ConfigError(f"--{option.replace('_', '-')}: no such file {path!r}")

    def _check_workers(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"--workers: must be at least 1, got {self.workers}")
        if self.workers > MAX_WORKERS:
            raise ConfigError(f"--workers: at most {MAX_WORKERS}, got {self.workers}")
        if self.workers == 1:
            return
        for option, address in (
            ("listen", self.listen_address),
            ("listen-tls", self.listen_tls_address),
        ):
            if address is not None and address[1] == 0:
                raise ConfigError(
                    f"--workers {self.workers}: --{option} needs a fixed port (not 0): "
                    "the workers share it"
                )
        admin_port = self.admin_address[1]
        if admin_port and admin_port + self.workers - 1 > 65535:
            raise ConfigError(
                f"--workers {self.workers}: the admin ports {admin_port}.."
                f"{admin_port + self.workers - 1} (one per worker) pass 65535"
            )

    def _check_admin_auth(self, admin_host: str) -> None:
        users = _parse_users(self.admin_users)  # validates the format
        mode = self.admin_auth
        if mode is None:
            mode = "users" if users else "none"
            object.__setattr__(self, "admin_auth", mode)
        if mode not in ("none", "users", "rabbitmq"):
            raise ConfigError(f"--admin-auth: expected none, users or rabbitmq, got {mode!r}")
        if mode == "users" and not users:
            raise ConfigError("--admin-auth users: needs --admin-users USER:PASS[,USER:PASS...]")
        if mode == "none" and not _is_loopback(admin_host):
            raise ConfigError(
                f"--admin-listen {self.admin_listen}: the admin API may listen on a "
                "non-loopback address only with credentials: set --admin-users "
                "USER:PASS[,...] or --admin-auth rabbitmq"
            )

    @property
    def admin_credentials(self) -> dict[str, str]:
        """``--admin-users`` as {user: password}."""
        return _parse_users(self.admin_users)

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """``--listen`` as (host, port); None for ``--listen none``."""
        if self.listen.strip().lower() == "none":
            return None
        return parse_host_port("listen", self.listen)

    @property
    def listen_tls_address(self) -> tuple[str, int] | None:
        """``--listen-tls`` as (host, port), or None."""
        return parse_host_port("listen-tls", self.listen_tls) if self.listen_tls else None

    @property
    def upstream_tls(self) -> bool:
        """Whether ``--upstream`` is an ``amqps://`` URL."""
        return urlsplit(_split_urls(self.upstream)[0]).scheme == "amqps"

    @property
    def admin_allowed_host_names(self) -> frozenset[str]:
        """``--admin-allowed-hosts`` as lower-case names."""
        return frozenset(
            name.strip().lower()
            for name in (self.admin_allowed_hosts or "").split(",")
            if name.strip()
        )

    @property
    def admin_address(self) -> tuple[str, int]:
        """``--admin-listen`` as (host, port)."""
        return parse_host_port("admin-listen", self.admin_listen)

    @property
    def upstream_address(self) -> tuple[str, int]:
        """Host and port of ``--upstream``."""
        return self.upstream_addresses[0]

    @property
    def upstream_addresses(self) -> list[tuple[str, int]]:
        """Host and port of each ``--upstream`` node (a RabbitMQ cluster's nodes)."""
        default = 5671 if self.upstream_tls else 5672
        return [
            (parts.hostname or "localhost", parts.port or default)
            for parts in map(urlsplit, _split_urls(self.upstream))
        ]

    @property
    def management_bases(self) -> list[str]:
        """Each ``--management-url`` without credentials or trailing slash."""
        return [_base(url) for url in _split_urls(self.management_url)]

    @property
    def management_credentials(self) -> tuple[str, str]:
        """User and password for the management API.

        From ``--management-url`` when it carries them, else from
        ``--upstream``, else guest/guest.
        """
        return _credentials(_split_urls(self.management_url)[0], _split_urls(self.upstream)[0])

    @property
    def upstream_credentials(self) -> tuple[str, str]:
        """User and password of the gateway's own connections to RabbitMQ.

        From ``--upstream`` when it carries them, else those of the
        management API.
        """
        return _credentials(_split_urls(self.upstream)[0], _split_urls(self.management_url)[0])

    @property
    def management_base(self) -> str:
        """The first ``--management-url`` without credentials or trailing slash."""
        return self.management_bases[0]


def _split_urls(value: str) -> list[str]:
    """Comma-separated URLs (the nodes of one RabbitMQ cluster)."""
    return [url.strip() for url in value.split(",") if url.strip()]


def _split_url(option: str, url: str) -> SplitResult:
    """``urlsplit(url)`` for ``--OPTION``, refusing a URL the gateway could
    not connect to once started.

    Raises:
        ConfigError: a malformed URL, or a port that is not an integer in
            1..65535; the message names the option and the URL (its password
            hidden).
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"--{option}: malformed URL {url!r}: {exc}") from None
    try:
        port = parts.port
    except ValueError:  # not digits, or above 65535
        port = 0
    if port == 0:
        raise ConfigError(
            f"--{option}: the port of {without_password(url)!r} must be an integer in 1..65535"
        )
    return parts


def without_password(url: str) -> str:
    """``url`` with its password, if any, shown as ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _base(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.hostname or "localhost"
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def _parse_users(value: str | None) -> dict[str, str]:
    users: dict[str, str] = {}
    for raw in (value or "").split(","):
        item = raw.strip()
        if not item:
            continue
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ConfigError(
                f"--admin-users: expected USER:PASS[,USER:PASS...], got an entry {user!r} "
                "without a user or password"
            )
        users[user] = password
    return users


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credentials(*urls: str) -> tuple[str, str]:
    """User and password of the first URL that carries them, else guest/guest."""
    for url in urls:
        parts = urlsplit(url)
        if parts.username:
            return unquote(parts.username), unquote(parts.password or "")
    return "guest", "guest"
