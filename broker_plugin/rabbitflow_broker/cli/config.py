"""Gateway options: where the :class:`GatewayConfig` comes from.

Sources, later wins: defaults, ``--config FILE.toml``, environment
variables ``RABBITFLOW_BROKER_<OPTION>`` (e.g. ``RABBITFLOW_BROKER_LISTEN``),
command-line options.  The environment is read only in :func:`load_config`.
A bad value raises :class:`ConfigError` naming the option.  Every duration
is in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from rabbitflow_broker import accel
from rabbitflow_broker.hub.config import LOG_LEVELS, ConfigError, GatewayConfig, parse_host_port

__all__ = ["ConfigError", "GatewayConfig", "build_parser", "load_config", "parse_host_port"]

ENV_PREFIX = "RABBITFLOW_BROKER_"
#: The deprecated seconds form of ``--drain-timeout`` (now milliseconds).
DRAIN_TIMEOUT_SECONDS = "drain_timeout_seconds"


_FIELDS = {f.name: f for f in dataclasses.fields(GatewayConfig)}
_INT_FIELDS = {name for name, f in _FIELDS.items() if f.type == "int"}


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
