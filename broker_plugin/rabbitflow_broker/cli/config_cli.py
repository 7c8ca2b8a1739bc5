"""``rabbitflow-config``: the gateway's admin CLI (like ``qpid-config``).

An HTTP client of the gateway's admin API (``--admin-url``, default
``$RABBITFLOW_ADMIN_URL``, else ``http://127.0.0.1:15673``)::

    rabbitflow-config queues [--json]
    rabbitflow-config queue NAME [--json]
    rabbitflow-config add-queue NAME [--max-count N] [--max-size N] [--flow-stop-count N] ...
    rabbitflow-config delete-queue NAME [--if-empty] [--if-unused]
    rabbitflow-config set-flow NAME [--flow-stop-count N] [--flow-resume-count N] ...
    rabbitflow-config stop-producers [--vhost V] [--queue Q]
    rabbitflow-config start-producers [--vhost V] [--queue Q]

``add-queue`` (also ``add queue``, as in qpid-config) and ``delete-queue``
work over AMQP *through the gateway* (``--gateway-url``, default
``$RABBITFLOW_GATEWAY_URL``, else ``amqp://guest:guest@127.0.0.1:5673/%2F``),
so the gateway validates the ``qpid.flow_*`` arguments exactly as it does
for any client's declare and learns the queue at once.
``--max-count``/``--max-size`` become ``x-max-length``/``x-max-length-bytes``
with ``x-overflow: reject-publish`` (Qpid's ``reject`` limit policy) unless
``--overflow`` says otherwise.

The admin API's password comes from ``$RABBITFLOW_ADMIN_PASSWORD`` or, on a
terminal, a prompt (``--password`` still works but shows it in ``ps``); the
user from ``--user`` or ``$RABBITFLOW_ADMIN_USER``.

Exit status: 0 success; 1 the gateway could not be reached, refused the
credentials, or does not know the queue or the endpoint; 2 bad usage or a
value the gateway refused (400, or 406 on the declare).  Errors are one
line on stderr, never a traceback.

This module holds the options, the commands and the entry point.  How the
commands reach the gateway (HTTP, AMQP, :class:`CliError`) is in
:mod:`rabbitflow_broker.cli.config_client`; the text they print, in
:mod:`rabbitflow_broker.cli.config_output`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from rabbitflow_broker.cli.config_client import (
    EXIT_USAGE,
    PASSWORD_ENV,
    AdminClient,
    CliError,
    declare_queue,
    delete_queue,
)
from rabbitflow_broker.cli.config_output import format_count, format_queue, format_queues

__all__ = [
    "DEFAULT_ADMIN_URL",
    "DEFAULT_GATEWAY_URL",
    "AdminClient",
    "CliError",
    "declare_arguments",
    "main",
]

DEFAULT_ADMIN_URL = "http://127.0.0.1:15673"
DEFAULT_GATEWAY_URL = "amqp://guest:guest@127.0.0.1:5673/%2F"
PROG = "rabbitflow-config"

USER_ENV = "RABBITFLOW_ADMIN_USER"

#: CLI option (dest) -> admin API key / declare argument.
_FLOW_OPTIONS = {
    "flow_stop_count": ("flowStopCount", "qpid.flow_stop_count"),
    "flow_resume_count": ("flowResumeCount", "qpid.flow_resume_count"),
    "flow_stop_size": ("flowStopSize", "qpid.flow_stop_size"),
    "flow_resume_size": ("flowResumeSize", "qpid.flow_resume_size"),
}


def declare_arguments(
    *,
    max_count: int | None = None,
    max_size: int | None = None,
    overflow: str | None = None,
    flow: Mapping[str, int | None] | None = None,
) -> dict[str, object]:
    """The ``queue.declare`` arguments for ``add queue``.

    ``flow`` maps the option names of :data:`_FLOW_OPTIONS`
    (``flow_stop_count`` ...) to values; ``None`` values are left out.
    """
    arguments: dict[str, object] = {}
    if max_count is not None:
        arguments["x-max-length"] = max_count
    if max_size is not None:
        arguments["x-max-length-bytes"] = max_size
    if overflow is not None:
        arguments["x-overflow"] = overflow
    elif arguments:
        arguments["x-overflow"] = "reject-publish"
    for option, value in (flow or {}).items():
        if value is not None:
            arguments[_FLOW_OPTIONS[option][1]] = value
    return arguments


# -- commands ----------------------------------------------------------------------


def _emit(args: argparse.Namespace, value: Any, text: str) -> None:
    print(json.dumps(value, indent=2) if getattr(args, "json", False) else text)


def _cmd_queues(args: argparse.Namespace, client: AdminClient) -> int:
    queues = client.queues()
    vhost = getattr(args, "vhost", None)
    if vhost is not None:
        queues = [q for q in queues if q.get("vhost") == vhost]
    _emit(args, queues, format_queues(queues))
    return 0


def _cmd_queue(args: argparse.Namespace, client: AdminClient) -> int:
    queue = client.queue(_vhost(args), args.name)
    _emit(args, queue, format_queue(queue))
    return 0


def _flow_values(args: argparse.Namespace) -> dict[str, int | None]:
    return {option: getattr(args, option) for option in _FLOW_OPTIONS}


def _cmd_set_flow(args: argparse.Namespace, client: AdminClient) -> int:
    changes = {
        _FLOW_OPTIONS[option][0]: value
        for option, value in _flow_values(args).items()
        if value is not None
    }
    if not changes:
        raise CliError(
            "set-flow: give at least one of --flow-stop-count, --flow-resume-count, "
            "--flow-stop-size, --flow-resume-size",
            EXIT_USAGE,
        )
    queue = client.set_flow(_vhost(args), args.name, changes)
    warning = queue.pop("warning", None)
    _emit(args, queue, format_queue(queue))
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return 0


def _cmd_producers(args: argparse.Namespace, client: AdminClient) -> int:
    action = "stop" if args.command == "stop-producers" else "start"
    answer = client.producers(action, getattr(args, "vhost", None), args.queue)
    scope = f"queue {args.queue!r}" if args.queue else "all queues"
    where = f"vhost {args.vhost!r}" if getattr(args, "vhost", None) else "every vhost"
    verb = "stopped" if action == "stop" else "started"
    _emit(args, answer, f"Producers {verb} for {scope} in {where}")
    return 0


def _cmd_add(args: argparse.Namespace, _client: AdminClient) -> int:
    if getattr(args, "kind", "queue") != "queue":
        raise CliError(f"add: unknown object type {args.kind!r} (only 'queue')", EXIT_USAGE)
    arguments = declare_arguments(
        max_count=args.max_count,
        max_size=args.max_size,
        overflow=args.overflow,
        flow=_flow_values(args),
    )
    vhost = declare_queue(
        args.gateway_url,
        getattr(args, "vhost", None),
        args.name,
        durable=args.durable,
        arguments=arguments,
    )
    shown = ", ".join(f"{k}={v}" for k, v in arguments.items()) or "no arguments"
    durable = "durable" if args.durable else "transient"
    print(f"Queue {args.name!r} declared in vhost {vhost!r} ({durable}; {shown})")
    return 0


def _cmd_delete(args: argparse.Namespace, _client: AdminClient) -> int:
    vhost, messages = delete_queue(
        args.gateway_url,
        getattr(args, "vhost", None),
        args.name,
        if_unused=args.if_unused,
        if_empty=args.if_empty,
    )
    print(
        f"Queue {args.name!r} deleted in vhost {vhost!r} "
        f"({format_count(messages)} messages with it)"
    )
    return 0


def _vhost(args: argparse.Namespace) -> str:
    vhost = getattr(args, "vhost", None)
    return "/" if vhost is None else str(vhost)


def _non_negative(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


_FLOW_HELP = {
    "flow_stop_count": "stop producers when the queue holds more than N messages "
    "(qpid.flow_stop_count)",
    "flow_resume_count": "resume them when it holds fewer than N messages "
    "(qpid.flow_resume_count; default: derived from the stop value)",
    "flow_stop_size": "stop producers when the queue's bodies exceed N bytes (qpid.flow_stop_size)",
    "flow_resume_size": "resume them when the bodies are under N bytes "
    "(qpid.flow_resume_size; default: derived from the stop value)",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``rabbitflow-config`` argument parser."""
    from rabbitflow_broker.version import __version__

    # One --vhost, accepted before or after the command.  SUPPRESS: a --vhost
    # given before the command is not overwritten by a default after it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--vhost",
        default=argparse.SUPPRESS,
        help='virtual host (default "/" for the commands on one queue; every vhost for '
        "queues, stop-producers and start-producers)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and configure rabbitflow gateway flow control.",
        epilog=f"Environment: RABBITFLOW_ADMIN_URL, {USER_ENV}, {PASSWORD_ENV}, "
        "RABBITFLOW_GATEWAY_URL.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-a",
        "--admin-url",
        default=None,
        help=f"gateway admin API (default $RABBITFLOW_ADMIN_URL, else {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument(
        "--user", default=None, help=f"HTTP basic user for the admin API (default ${USER_ENV})"
    )
    parser.add_argument(
        "--password",
        default=None,
        help=f"HTTP basic password; visible to other users in ps: prefer ${PASSWORD_ENV} "
        "or the prompt (asked on a terminal when --user is given)",
    )
    parser.add_argument(
        "--gateway-url",
        default=None,
        help="AMQP URL of the gateway for add-queue and delete-queue "
        # argparse %-formats help text: the URL's %2F must be escaped.
        f"(default $RABBITFLOW_GATEWAY_URL, else {DEFAULT_GATEWAY_URL.replace('%', '%%')})",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        type=str.lower,
        default="warning",
        help="log records of this level and above to stderr (default warning)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def flow_options(sub: argparse.ArgumentParser) -> None:
        for option, text in _FLOW_HELP.items():
            sub.add_argument(
                "--" + option.replace("_", "-"),
                dest=option,
                type=_non_negative,
                metavar="N",
                default=None,
                help=text,
            )

    def json_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--json", action="store_true", help="print the admin API's JSON")

    sub = commands.add_parser("queues", parents=[common], help="list queues and flow state")
    json_option(sub)
    sub.set_defaults(run=_cmd_queues)

    sub = commands.add_parser("queue", parents=[common], help="show one queue")
    sub.add_argument("name", help="the queue's name")
    json_option(sub)
    sub.set_defaults(run=_cmd_queue)

    def add_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("name", help="the queue's name")
        sub.add_argument(
            "--durable",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="survive a RabbitMQ restart (default durable)",
        )
        sub.add_argument(
            "--max-count", type=_non_negative, metavar="N", help="most messages (x-max-length)"
        )
        sub.add_argument(
            "--max-size",
            type=_non_negative,
            metavar="N",
            help="most body bytes (x-max-length-bytes)",
        )
        sub.add_argument(
            "--overflow",
            choices=("reject-publish", "reject-publish-dlx", "drop-head"),
            help="x-overflow (default reject-publish when a maximum is given)",
        )
        flow_options(sub)
        sub.set_defaults(run=_cmd_add)

    add_text = "declare a queue through the gateway"
    add_options(commands.add_parser("add-queue", parents=[common], help=add_text))
    # qpid-config's spelling: add queue NAME.
    sub = commands.add_parser("add", parents=[common], help=f"{add_text} (add queue NAME)")
    sub.add_argument("kind", metavar="queue", help="object type (queue)")
    add_options(sub)

    sub = commands.add_parser(
        "delete-queue", parents=[common], help="delete a queue through the gateway"
    )
    sub.add_argument("name", help="the queue's name")
    sub.add_argument("--if-empty", action="store_true", help="only if it holds no messages")
    sub.add_argument("--if-unused", action="store_true", help="only if it has no consumers")
    sub.set_defaults(run=_cmd_delete)

    sub = commands.add_parser("set-flow", parents=[common], help="set a queue's thresholds")
    sub.add_argument("name", help="the queue's name")
    json_option(sub)
    flow_options(sub)
    sub.set_defaults(run=_cmd_set_flow)

    for name, text in (("stop-producers", "block"), ("start-producers", "unblock")):
        sub = commands.add_parser(name, parents=[common], help=f"{text} producers")
        sub.add_argument("--queue", default=None, help="only the producers of this queue")
        json_option(sub)
        sub.set_defaults(run=_cmd_producers)
    return parser


def _password(
    args: argparse.Namespace,
    user: str | None,
    environ: Mapping[str, str],
    prompt: Callable[[str], str] | None,
) -> str | None:
    if args.password is not None:
        return str(args.password)
    if PASSWORD_ENV in environ:
        return environ[PASSWORD_ENV]
    if user is not None and prompt is not None:
        return prompt(f"Password for {user} on the gateway admin API: ")
    return None


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    prompt: Callable[[str], str] | None = None,
) -> int:
    """Console-script entry point; returns the exit status (see the module docstring).

    ``prompt`` asks for the admin password when ``--user`` is given without
    one (default: :func:`getpass.getpass` when stdin is a terminal).
    """
    environ = os.environ if environ is None else environ
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    admin_url = args.admin_url or environ.get("RABBITFLOW_ADMIN_URL") or DEFAULT_ADMIN_URL
    args.gateway_url = (
        args.gateway_url or environ.get("RABBITFLOW_GATEWAY_URL") or DEFAULT_GATEWAY_URL
    )
    if urlsplit(admin_url).scheme not in ("http", "https"):
        print(
            f"{PROG}: --admin-url: expected an http(s):// URL, got {admin_url!r}", file=sys.stderr
        )
        return EXIT_USAGE
    if args.run in (_cmd_add, _cmd_delete):
        prompt = None  # these go through AMQP, not the admin API
    elif prompt is None and sys.stdin is not None and sys.stdin.isatty():
        prompt = getpass.getpass
    user = args.user or environ.get(USER_ENV)
    try:
        password = _password(args, user, environ, prompt)
    except (EOFError, KeyboardInterrupt):
        print(f"{PROG}: no password given", file=sys.stderr)
        return EXIT_USAGE
    client = AdminClient(base_url=admin_url, user=user, password=password)
    try:
        code: int = args.run(args, client)
    except CliError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
