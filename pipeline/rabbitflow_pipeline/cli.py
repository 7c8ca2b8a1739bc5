"""``rabbitflow-analyze``: the command line (arguments in, a batch run or incremental steps out).

    rabbitflow-analyze EVENT_LOG... --out DIR [--client-log PATH...]
                       [--queue-limits FILE.json] [--master URL | --remote URL]
                       [--incremental | --follow [--trigger SECONDS]]

Local mode (``local[2]``) unless ``--master`` is given or the job runs
under ``spark-submit`` (which supplies the master); see docs/pipeline.md.
The analysis itself is :func:`rabbitflow_pipeline.batch.analyze` and
:func:`rabbitflow_pipeline.incremental.run_step`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.incremental import DEFAULT_LATENESS_S, StepResult, follow, run_step
from rabbitflow_pipeline.limits import DEFAULT_FLOW_STOP_THRESHOLD, parse_queue_limits
from rabbitflow_pipeline.session import build_session

__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rabbitflow")
    except PackageNotFoundError:
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rabbitflow-analyze",
        description="Analyse rabbitflow gateway event logs (and client logs) with Spark.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        type=str.lower,
        default="warning",
        help="log records of this level and above to stderr (default warning; Spark's own "
        "log stays at ERROR)",
    )
    parser.add_argument("event_logs", nargs="+", metavar="EVENT_LOG", help="files or globs")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument(
        "--client-log", action="append", default=[], metavar="PATH", help="client JSON log"
    )
    parser.add_argument(
        "--queue-limits",
        type=Path,
        metavar="FILE.json",
        help="queue maxima (own format or an admin/management API /api/queues snapshot)",
    )
    parser.add_argument(
        "--default-flow-stop-threshold",
        type=int,
        default=DEFAULT_FLOW_STOP_THRESHOLD,
        metavar="PCT",
        help="the gateway's setting of that name, to find a queue's maximum from its default "
        f"thresholds in a gateway /api/queues snapshot (default {DEFAULT_FLOW_STOP_THRESHOLD})",
    )
    parser.add_argument("--master", help="Spark master URL (default local[2])")
    parser.add_argument(
        "--remote", metavar="sc://HOST:PORT", help="run through a Spark Connect server instead"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--incremental",
        action="store_true",
        help="read only what was added since the last run (checkpoint under --out), then exit",
    )
    mode.add_argument(
        "--follow",
        action="store_true",
        help="keep running: an incremental step every --trigger seconds, until interrupted",
    )
    parser.add_argument(
        "--trigger",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between the starts of two --follow steps (default 10)",
    )
    parser.add_argument(
        "--lateness",
        type=float,
        default=DEFAULT_LATENESS_S,
        metavar="SECONDS",
        help="how late an event of one file may arrive after newer events of another "
        f"(--incremental/--follow; default {DEFAULT_LATENESS_S:.0f})",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the job; returns the process exit status.

    0 on success, 1 when every event-log line was malformed (the commonest
    reason is printed), 2 on bad arguments.  ``spark`` is a session to run
    in (left running); by default the job builds its own and stops it.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    limits = None
    if args.queue_limits is not None:
        try:
            limits = parse_queue_limits(
                json.loads(args.queue_limits.read_text(encoding="utf-8")),
                default_stop_pct=args.default_flow_stop_threshold,
            )
        except (OSError, ValueError) as exc:
            print(f"rabbitflow-analyze: --queue-limits {args.queue_limits}: {exc}", file=sys.stderr)
            return 2
    if args.trigger <= 0 or args.lateness < 0:
        print(
            "rabbitflow-analyze: --trigger must be positive, --lateness not negative",
            file=sys.stderr,
        )
        return 2
    if args.master is not None and args.remote is not None:
        print("rabbitflow-analyze: give --master or --remote, not both", file=sys.stderr)
        return 2
    session = build_session(args.master, remote=args.remote) if spark is None else spark
    try:
        if args.follow or args.incremental:
            return _live(session, args, limits)
        result = analyze(
            session, args.event_logs, args.out, client_paths=args.client_log, queue_limits=limits
        )
    finally:
        if spark is None:
            session.stop()
    print(
        f"rabbitflow-analyze: {result.events:,} events, {result.malformed:,} malformed lines, "
        f"{result.episodes:,} flow episodes in {result.seconds:.1f}s → {result.out}"
    )
    if result.all_malformed:
        reason, count = result.malformed_reasons[0]
        _all_malformed(result.malformed, reason, count)
        return 1
    return 0


def _live(
    session: SparkSession,
    args: argparse.Namespace,
    limits: list[tuple[str, str, int | None, int | None]] | None,
) -> int:
    """``--follow`` or ``--incremental``; an input path that names nothing, or a
    file that cannot be read or written, ends the run with its error (exit 2)."""
    try:
        if args.follow:
            return _follow(session, args, limits)
        step = _step(session, args, limits, live=False)
    except OSError as exc:
        print(f"rabbitflow-analyze: error: {exc}", file=sys.stderr)
        return 2
    return 1 if step.all_malformed else 0


def _all_malformed(malformed: int, reason: str, count: int) -> None:
    print(
        f"rabbitflow-analyze: error: every one of the {malformed:,} event-log lines "
        f"is malformed; commonest reason: {reason} ({count:,} lines). Expected the "
        "gateway's JSON event records or Broker-J operational log lines "
        "(see the malformed table and docs/pipeline.md)",
        file=sys.stderr,
    )


def _step(
    session: SparkSession,
    args: argparse.Namespace,
    limits: list[tuple[str, str, int | None, int | None]] | None,
    *,
    live: bool,
) -> StepResult:
    result = run_step(
        session,
        args.event_logs,
        args.out,
        client_paths=args.client_log,
        queue_limits=limits,
        lateness_s=args.lateness,
        live=live,
    )
    _print_step(result)
    if not result.changed:
        print(f"rabbitflow-analyze: no new input since step {result.batch}", flush=True)
    return result


def _print_step(result: StepResult) -> None:
    if result.changed:
        print(
            f"rabbitflow-analyze: step {result.batch}: {result.new_bytes:,} new bytes; "
            f"{result.events:,} events, {result.malformed:,} malformed lines, "
            f"{result.episodes:,} flow episodes ({result.open_episodes:,} open) "
            f"in {result.seconds:.1f}s → {result.out}",
            flush=True,
        )
    if result.all_malformed and result.malformed_reasons:
        reason, count = result.malformed_reasons[0]
        _all_malformed(result.malformed, reason, count)
    elif result.all_malformed:  # nothing new: the reasons are in the stored table
        print(
            f"rabbitflow-analyze: error: every one of the {result.malformed:,} event-log "
            f"lines read so far is malformed; their reasons are in {result.out / 'malformed'}",
            file=sys.stderr,
        )


def _follow(
    session: SparkSession,
    args: argparse.Namespace,
    limits: list[tuple[str, str, int | None, int | None]] | None,
) -> int:
    """Steps every ``--trigger`` seconds until SIGINT/SIGTERM (the step under way finishes)."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, request_stop)
    try:
        follow(
            session,
            args.event_logs,
            args.out,
            trigger_s=args.trigger,
            stop=stop,
            on_step=_print_step,
            client_paths=args.client_log,
            queue_limits=limits,
            lateness_s=args.lateness,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
