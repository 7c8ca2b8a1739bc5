"""Gateway options: one immutable, validated :class:`GatewayConfig`.

Sources, later wins: defaults, ``--config FILE.toml``, environment
variables ``RABBITFLOW_BROKER_<OPTION>`` (e.g. ``RABBITFLOW_BROKER_LISTEN``),
command-line options.  The environment is read only in :func:`load_config`.
A bad value raises :class:`ConfigError` naming the option.  Every duration
is in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from rabbitflow_broker import accel
from rabbitflow_broker.engine.errors import UsageError

__all__ = ["ConfigError", "GatewayConfig", "build_parser", "load_config", "parse_host_port"]

ENV_PREFIX = "RABBITFLOW_BROKER_"
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The deprecated seconds form of ``--drain-timeout`` (now milliseconds).
DRAIN_TIMEOUT_SECONDS = "drain_timeout_seconds"


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
            if urlsplit(url).scheme not in ("amqp", "amqps"):
                raise ConfigError(f"--upstream: expected an amqp:// URL, got {url!r}")
        if len({urlsplit(url).scheme for url in upstreams}) > 1:
            raise ConfigError("--upstream: the nodes must all be amqp:// or all amqps://")
        for url in _split_urls(self.management_url):
            if urlsplit(url).scheme not in ("http", "https"):
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


_FIELDS = {f.name: f for f in dataclasses.fields(GatewayConfig)}
_INT_FIELDS = {name for name, f in _FIELDS.items() if f.type == "int"}


def _credentials(*urls: str) -> tuple[str, str]:
    """User and password of the first URL that carries them, else guest/guest."""
    for url in urls:
        parts = urlsplit(url)
        if parts.username:
            return unquote(parts.username), unquote(parts.password or "")
    return "guest", "guest"


class _PrintAndExit(argparse.Action):
    """``--version``: print ``text`` as it is (argparse's own action re-wraps it)."""

    def __init__(self, *args: Any, text: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text = text

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(self.text)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``rabbitflow-broker`` argument parser (no defaults: they merge later)."""
    from rabbitflow_broker.version import __version__

    parser = argparse.ArgumentParser(
        prog="rabbitflow-broker",
        description="AMQP 0-9-1 gateway adding Qpid-style producer flow control to RabbitMQ.",
        epilog=(
            "Every option can also be set in the environment as RABBITFLOW_BROKER_<OPTION> "
            "(upper case, '-' as '_': e.g. RABBITFLOW_BROKER_LISTEN=0.0.0.0:5673, "
            "RABBITFLOW_BROKER_ADMIN_USERS, RABBITFLOW_BROKER_CONFIG) or in the TOML file "
            '(listen = "0.0.0.0:5673"); later wins: file, environment, command line. '
            "Durations are in milliseconds."
        ),
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--version",
        action=_PrintAndExit,
        nargs=0,
        default=argparse.SUPPRESS,
        text=f"rabbitflow-broker {__version__} (engine: {accel.status()})",
        help="print the version and the engine in use (compiled or pure Python), then exit",
    )
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="read options from a TOML file [env: RABBITFLOW_BROKER_CONFIG]",
    )
    help_text = {
        "listen": "AMQP address to serve (default 127.0.0.1:5673; none: TLS only)",
        "upstream": "RabbitMQ AMQP URL, or the nodes of a RabbitMQ cluster comma-separated: "
        "each client connection goes to the first node that answers, round robin "
        "(default amqp://localhost:5672)",
        "management_url": "RabbitMQ management API URL, or one per node comma-separated: "
        "the first that answers is used (default http://localhost:15672)",
        "admin_listen": "admin HTTP API address (default 127.0.0.1:15673)",
        "default_flow_stop_threshold": "percent of a queue's maximum to stop at (80)",
        "default_flow_resume_threshold": "percent of a queue's maximum to resume below (70)",
        "default_queue_limit": "bytes assumed as maximum for queues without one (104857600)",
        "store_overfull_size": "vhost store bytes that block all producers (0 = off)",
        "store_underfull_size": "vhost store bytes under which producers resume (0 = off)",
        "flow_enforcement_timeout": "ms a flowed channel may keep publishing (5000)",
        "handshake_timeout": "ms a client may take to log in and open its connection "
        "(10000; 0 = no limit)",
        "event_log": "append events as JSON lines to this file",
        "event_log_max_bytes": "rotate the event log to PATH.1 before it passes this many "
        "bytes (0 = never)",
        "event_log_keep": "rotated event logs to keep, PATH.1 to PATH.N (5)",
        "event_log_max_age": "rotate the event log after this many seconds (0 = never)",
        "log_format": "console or json (default console)",
        "log_level": "lowest level logged: debug, info, warning or error (default info)",
        "event_loop": "auto, asyncio or uvloop (default auto: uvloop when installed)",
        "state_file": "keep runtime thresholds in this JSON file instead of RabbitMQ",
        "reconcile_interval": "ms between depth reconciliations with RabbitMQ (1000)",
        "depth_poll_interval": "ms between passive declares of the queues that are flowed "
        "or near their stop threshold, for their current depth (250; 0 = off)",
        "routing_refresh_interval": "ms between routing snapshots from RabbitMQ (30000)",
        "store_path": "RabbitMQ data dir: measure the vhost store on disk instead of "
        "message_bytes_persistent from the management API",
        "store_poll_interval": "ms between store size measurements (1000)",
        "admin_users": "admin API users as USER:PASS[,USER:PASS...] (HTTP basic)",
        "admin_auth": "admin API authentication: none, users or rabbitmq "
        "(default users when --admin-users is set, else none)",
        "admin_allowed_hosts": "extra names the admin API answers to in the Host header, "
        "comma-separated (besides its listen address and localhost)",
        "listen_backlog": "queue of connections not yet accepted, per listener (1024)",
        "drain_timeout": "ms SIGTERM waits for in-flight confirms before closing "
        "clients with 320 (10000)",
        "listen_tls": "AMQPS address to serve (HOST:PORT; needs --tls-cert and --tls-key)",
        "tls_cert": "PEM certificate chain of --listen-tls (reloaded on SIGHUP)",
        "tls_key": "PEM private key of --listen-tls (reloaded on SIGHUP)",
        "tls_client_ca": "PEM CA bundle: require client certificates signed by it",
        "upstream_ca": "PEM CA bundle to verify an amqps:// --upstream (default: system CAs)",
        "cluster": "share one flow state with every gateway started with this cluster name "
        "in front of the same RabbitMQ (default: standalone)",
        "cluster_batch": "messages one cluster member may accept for a queue before the "
        "others know (100)",
        "cluster_lease": "ms a member's allowance lasts without the cluster's owner (2000)",
        "workers": "gateway processes serving the same --listen/--listen-tls port "
        "(SO_REUSEPORT), members of one cluster (--cluster NAME, or one named after the "
        "host and port); worker I serves its admin API on the --admin-listen port + I "
        "(port 0: each picks a free one) and writes --event-log as PATH-wI; a supervisor "
        "forwards SIGTERM/SIGINT/SIGHUP and restarts a worker that dies (1)",
        "read_pause_us": "µs the event loop sleeps after reading a client with a deep pipe of "
        "messages, for fewer, larger reads and writes (100; 0 = no pause and no yield)",
    }
    for name, summary in help_text.items():
        flag = "--" + name.replace("_", "-")
        text = f"{summary} [env: {ENV_PREFIX}{name.upper()}]"
        if name == "log_format":
            parser.add_argument(flag, dest=name, choices=("console", "json"), help=text)
        elif name == "log_level":
            parser.add_argument(flag, dest=name, choices=LOG_LEVELS, type=str.lower, help=text)
        elif name == "event_loop":
            parser.add_argument(flag, dest=name, choices=("auto", "asyncio", "uvloop"), help=text)
        elif name == "admin_auth":
            parser.add_argument(flag, dest=name, choices=("none", "users", "rabbitmq"), help=text)
        else:
            parser.add_argument(flag, dest=name, help=text)
    parser.add_argument(
        "--drain-timeout-seconds",
        dest=DRAIN_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="deprecated: --drain-timeout in seconds (use --drain-timeout in ms) "
        f"[env: {ENV_PREFIX}{DRAIN_TIMEOUT_SECONDS.upper()}]",
    )
    return parser


def _coerce(name: str, value: object, origin: str) -> object:
    if name in _INT_FIELDS:
        if isinstance(value, bool):
            raise ConfigError(f"{origin}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            return int(str(value).replace("_", ""))
        except ValueError:
            raise ConfigError(f"{origin}: expected an integer, got {value!r}") from None
    if not isinstance(value, str):
        raise ConfigError(f"{origin}: expected a string, got {value!r}")
    return value


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Build the configuration from command line, environment and TOML file.

    Raises:
        ConfigError: unreadable config file, unknown key, or bad value.
        SystemExit: from argparse for unknown options or ``--help``.
    """
    environ = os.environ if environ is None else environ
    args = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    seconds = args.pop(DRAIN_TIMEOUT_SECONDS, None)
    config_path = args.pop("config", None) or environ.get(ENV_PREFIX + "CONFIG")
    if config_path:
        try:
            with open(config_path, "rb") as handle:
                data = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"--config: cannot read {config_path}: {exc}") from exc
        section = data.get("rabbitflow-broker", data)
        for key, value in section.items():
            name = key.replace("-", "_")
            if name == DRAIN_TIMEOUT_SECONDS:
                values["drain_timeout"] = _seconds_to_ms(value, f"{key} in {config_path}")
                continue
            if name not in _FIELDS:
                raise ConfigError(f"--config: unknown option {key!r} in {config_path}")
            values[name] = _coerce(name, value, f"{key} in {config_path}")
    env_seconds = ENV_PREFIX + DRAIN_TIMEOUT_SECONDS.upper()
    if env_seconds in environ:
        values["drain_timeout"] = _seconds_to_ms(environ[env_seconds], env_seconds)
    for name in _FIELDS:
        env_name = ENV_PREFIX + name.upper()
        if env_name in environ:
            values[name] = _coerce(name, environ[env_name], env_name)
    if seconds is not None:
        values["drain_timeout"] = _seconds_to_ms(seconds, "--drain-timeout-seconds")
    for name, value in args.items():
        values[name] = _coerce(name, value, "--" + name.replace("_", "-"))
    return GatewayConfig(**values)


def _seconds_to_ms(value: object, origin: str) -> int:
    seconds = _coerce("drain_timeout", value, origin)
    assert isinstance(seconds, int)
    warnings.warn(
        f"{origin} is deprecated: use --drain-timeout {seconds * 1000} (milliseconds)",
        FutureWarning,  # shown by default: the operator should see it
        stacklevel=3,
    )
    return seconds * 1000
