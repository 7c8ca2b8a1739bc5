"""``rabbitflow-broker``: run the gateway.

The command line is the application, so unlike the library modules it
configures structlog: console lines or JSON, to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import warnings
from collections.abc import Callable, Sequence

import structlog

from rabbitflow_broker.admin.api import create_app
from rabbitflow_broker.cli.config import ConfigError, GatewayConfig, load_config
from rabbitflow_broker.cli.workers import Supervisor, worker_index
from rabbitflow_broker.server.gc_policy import CollectorPolicy
from rabbitflow_broker.server.service import GatewayService

__all__ = ["configure_logging", "event_loop_factory", "main"]


def configure_logging(log_format: str, log_level: str = "info") -> None:
    """Route structlog and stdlib logging to stderr as console or JSON lines,
    from ``log_level`` (debug, info, warning, error) up."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processor=renderer)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(max(logging.WARNING, root.level))


async def serve(config: GatewayConfig) -> None:
    """Run the gateway until SIGINT/SIGTERM; SIGHUP reloads the TLS certificates.

    Raises:
        OSError: a listen address cannot be bound.
    """
    service = GatewayService(config, admin_app=create_app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError, AttributeError):
        # Operators rotate certificates: SIGHUP reloads them, connections stay.
        loop.add_signal_handler(signal.SIGHUP, service.reload_tls)
    await service.start()
    try:
        await stop.wait()
    finally:
        await service.stop(drain_timeout=config.drain_timeout / 1000)


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``--event-loop`` (None: asyncio's own loop).

    ``auto`` takes uvloop when it is installed (the ``broker`` extra
    installs it where it builds): its transports spend less CPU per relayed
    frame than asyncio's own.

    Raises:
        ConfigError: ``uvloop`` was asked for and is not installed.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit status.

    With ``--workers N`` (N > 1) this process supervises N gateway
    processes (:mod:`rabbitflow_broker.cli.workers`) instead of serving.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings(record=True) as deprecations:
        warnings.simplefilter("always", FutureWarning)
        try:
            config = load_config(argv)
        except ConfigError as exc:
            error: ConfigError | None = exc
        else:
            error = None
    for deprecation in deprecations:
        print(f"rabbitflow-broker: warning: {deprecation.message}", file=sys.stderr)
    if error is not None:
        print(f"rabbitflow-broker: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_format, config.log_level)
    index = worker_index()
    if config.workers > 1 and index is None:
        return asyncio.run(Supervisor(config, argv).run())
    if index is not None:
        structlog.contextvars.bind_contextvars(worker=index)
    try:
        loop_factory = event_loop_factory(config.event_loop)
    except ConfigError as exc:
        print(f"rabbitflow-broker: {exc}", file=sys.stderr)
        return 2
    # Rare young collections, nothing loaded at start scanned again; the
    # service adds a periodic full collection (rabbitflow_broker.server.gc_policy).
    CollectorPolicy().install()
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(config))
    except OSError as exc:
        print(f"rabbitflow-broker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
