"""What the gateway service reads and writes on its host, outside the gateway's state.

The TLS contexts of the client listener and of an ``amqps://`` upstream,
the event loop's handler that names file-descriptor exhaustion (when the
listeners cannot accept), the :class:`DescriptorWatch` that names it when
the loop cannot (uvloop drops what it cannot accept without a word), the
:class:`EventSink` that writes each event to the console and
``--event-log``, and the message store's size on disk for ``--store-path``.
:mod:`rabbitflow_broker.server.service` uses and re-exports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import os
import resource
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import structlog

from rabbitflow_broker.events import Event
from rabbitflow_broker.hub.config import GatewayConfig

__all__ = [
    "DescriptorWatch",
    "EventSink",
    "disk_store_sizes",
    "loop_exception_handler",
    "server_ssl_context",
    "upstream_ssl_context",
]

_log = structlog.get_logger("rabbitflow.broker")
_events_log = structlog.get_logger("rabbitflow.broker.events")

_FD_ERRNOS = (errno.EMFILE, errno.ENFILE)


def server_ssl_context(config: GatewayConfig) -> ssl.SSLContext:
    """The TLS context of ``--listen-tls`` (certificate, key, optional client CA).

    Raises:
        ssl.SSLError, OSError: a file is unreadable or not a matching PEM.
    """
    if config.tls_cert is None or config.tls_key is None:
        raise ValueError("server_ssl_context needs --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca:
        context.load_verify_locations(cafile=config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def upstream_ssl_context(config: GatewayConfig) -> ssl.SSLContext:
    """The TLS context for an ``amqps://`` upstream: verified, hostname checked.

    Against ``--upstream-ca`` when given, else the system's CAs.

    Raises:
        ssl.SSLError, OSError: the CA file is unreadable or not PEM.
    """
    return ssl.create_default_context(cafile=config.upstream_ca)


class EventSink:
    """Console line + JSON event log for every event; callable.

    The event log rotates like a log file: before a record would take it
    past ``max_bytes`` (0: no limit), or once it has been open for
    ``max_age_s`` seconds (0: no limit; ``clock`` is the time source),
    ``PATH`` is renamed ``PATH.1`` (``PATH.1`` to ``PATH.2``, and so on;
    the oldest past ``keep`` is deleted) and a new ``PATH`` is started.
    A record is never split across two files.  Renaming keeps each file's
    identity, so ``rabbitflow-analyze --follow`` reading ``PATH*`` reads
    every record once.
    """

    def __init__(
        self,
        event_log: str | None,
        *,
        max_bytes: int = 0,
        keep: int = 5,
        max_age_s: float = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_bytes < 0 or keep < 1 or max_age_s < 0:
            raise ValueError("event log rotation: max_bytes and max_age_s >= 0, keep >= 1")
        self._path = event_log
        self._file: IO[str] | None = None
        self._max_bytes = max_bytes
        self._keep = keep
        self._max_age_s = max_age_s
        self._clock = clock
        self._opened_at = 0.0
        self._size = 0
        #: The cluster member id, added to every record as ``gateway`` (None: none).
        self.gateway: str | None = None

    def __call__(self, event: Event) -> None:
        record = event.to_record()
        if self.gateway is not None:
            record["gateway"] = self.gateway
        _events_log.info(event.line(), code=event.code)
        if self._path is not None:
            text = json.dumps(record, default=str) + "\n"
            size = len(text.encode("utf-8"))
            if self._file is not None and self._due(size):
                self._rotate()
            if self._file is None:
                self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115
                self._size = self._file.tell()
                self._opened_at = self._clock()
            self._file.write(text)
            self._file.flush()
            self._size += size

    def _due(self, size: int) -> bool:
        by_size = self._max_bytes > 0 and self._size > 0 and self._size + size > self._max_bytes
        by_age = self._max_age_s > 0 and self._clock() - self._opened_at >= self._max_age_s
        return by_size or by_age

    def _rotate(self) -> None:
        assert self._path is not None
        self.close()
        path = self._path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}.{self._keep}")
        for index in range(self._keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{path}.{index}", f"{path}.{index + 1}")
        os.rename(path, f"{path}.1")

    def close(self) -> None:
        """Close the event log."""
        if self._file is not None:
            self._file.close()
            self._file = None


def disk_store_sizes(data_dir: str) -> dict[str, int]:
    """vhost -> bytes on disk of its message store under a RabbitMQ data dir.

    RabbitMQ keeps each vhost's store in ``msg_stores/vhosts/<hash>/`` with
    the vhost's name in a ``.vhost`` file there; ``data_dir`` may be the
    node's data directory (``.../mnesia/rabbit@host``) or any directory
    above it.  Files that vanish while being measured (segment compaction)
    are skipped.

    Raises:
        OSError: ``data_dir`` cannot be read.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"--store-path: {data_dir} is not a directory")
    sizes: dict[str, int] = {}
    for marker in root.glob("**/msg_stores/vhosts/*/.vhost"):
        try:
            vhost = marker.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        total = 0
        for dirpath, _dirs, files in os.walk(marker.parent):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(dirpath, name)).st_size
        sizes[vhost] = sizes.get(vhost, 0) + total
    return sizes


_FD_MESSAGE = (
    "too many open files: connections are not accepted until some close "
    "(raise the limit: ulimit -n, or LimitNOFILE= in a systemd unit)"
)


class DescriptorWatch:
    """Says "too many open files" when a socket took the last descriptor the process may open.

    Linux hands out the lowest free descriptor, so a socket numbered
    limit - 1 leaves none free: the next accept fails.  asyncio's own loop
    reports that failure (:func:`loop_exception_handler`); uvloop's (libuv)
    accepts and drops the client without a word, so the relay shows each
    socket it opens or accepts here, and :meth:`watch` also tries the table
    every second (the last descriptor may go to a socket of the gateway's
    own, e.g. toward the management API).  One line per ``quiet_s`` at most.
    """

    def __init__(self, limit: int | None, *, quiet_s: float = 10.0) -> None:
        self.limit = limit  # None: no limit
        self._quiet_s = quiet_s
        self._said_at = -math.inf

    @classmethod
    def of_this_process(cls) -> DescriptorWatch:
        """Watches this process's soft ``RLIMIT_NOFILE`` (as it is now)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return cls(None if soft == resource.RLIM_INFINITY else soft)

    def opened(self, transport: asyncio.BaseTransport) -> None:
        """A socket was accepted or connected: say so if it was the last descriptor."""
        if self.limit is None:
            return
        sock = transport.get_extra_info("socket")
        number = sock.fileno() if sock is not None else -1
        if number >= self.limit - 1:
            self._say()

    def full(self) -> bool:
        """Whether the descriptor table is full now (said if so): one open and close."""
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            if exc.errno in _FD_ERRNOS:
                self._say()
                return True
        return False

    async def watch(
        self, also: Callable[[], Awaitable[None]] | None = None, interval_s: float = 1.0
    ) -> None:
        """Try the table every ``interval_s`` (see :meth:`full`), then run
        ``also`` (the listeners' check), until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.full()
            if also is not None:
                try:
                    await also()
                except Exception:  # one bad check must not end the watch
                    _log.exception("descriptor watch: check failed")

    def _say(self) -> None:
        now = time.monotonic()
        if now - self._said_at >= self._quiet_s:
            self._said_at = now
            _log.error(_FD_MESSAGE, limit=self.limit)


def listener_lost(server: asyncio.AbstractServer) -> bool:
    """Whether the event loop closed a listener of ``server`` under it.

    uvloop closes a listening socket, without a word, when libuv's accept
    callback reports an error (it can when descriptors run out); the socket
    object the server handed out then has no descriptor left.
    """
    sockets = getattr(server, "sockets", None) or ()
    return not sockets or any(sock is None or sock.fileno() < 0 for sock in sockets)


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Say "too many open files" for fd exhaustion (accept errors too); else asyncio's default."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in _FD_ERRNOS:
        _log.error(
            _FD_MESSAGE,
            error=str(exc),
            context=str(context.get("message", "")),
        )
        return
    loop.default_exception_handler(context)
