"""The asyncio driver of one relayed connection.

:class:`Relay` is the protocol of an accepted client socket.  It opens the
upstream connection (TLS when asked); its
:class:`~rabbitflow_broker.server.relay_pump.Pump` (compiled with the engine) feeds
every read of either socket to the connection's
:class:`~rabbitflow_broker.engine.connection.Engine` with the clock and carries out the
:class:`~rabbitflow_broker.engine.connection.Actions` the engine returns: one write per
side, events to the gateway's sink; the relay itself pauses or resumes
reads, keeps the one timer and closes.  All AMQP decisions are the
engine's.  After client reads the loop may give the CPU away once or
sleep a moment, as the service's read-pause policy says
(:mod:`~rabbitflow_broker.server.read_pause`; none when the relay is given none).

TCP back-pressure passes through: while one side's transport buffers more
than its high-water mark, the other side is not read (toward RabbitMQ a
small one: :data:`UPSTREAM_UNSENT`).  When the
gateway's blocking state changes, :class:`~rabbitflow_broker.server.refresher.Refresher`
calls :meth:`Relay.refresh` on a later turn of the event loop.

Once both sockets are closed the relay cancels its timers and lets go of
its transports, pump and engine's channels: a closed connection is freed
by reference counting at once, nothing of it waits for the cycle
collector (which the gateway runs rarely, see
:mod:`~rabbitflow_broker.server.gc_policy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import cast

import structlog

from rabbitflow_broker.engine.allowance import PAUSE_BYTES, PAUSE_MESSAGES
from rabbitflow_broker.engine.connection import Engine, EngineSettings
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.read_pause import OFF, ReadPause
from rabbitflow_broker.server.refresher import Refresher
from rabbitflow_broker.server.relay_pump import Pump
from rabbitflow_broker.server.relay_views import EngineViews
from rabbitflow_broker.server.service_io import DescriptorWatch
from rabbitflow_broker.version import __version__

__all__ = ["PAUSE_BYTES", "PAUSE_MESSAGES", "WRITE_HIGH_WATER", "Connector", "Relay"]

#: Opens the upstream connection: called with the address and a protocol
#: factory, returns the transport (``loop.create_connection`` by default).
Connector = Callable[[str, int, Callable[[], asyncio.Protocol]], Awaitable[asyncio.BaseTransport]]

_log = structlog.get_logger("rabbitflow.broker.relay")
#: What clients read in Connection.Start's ``rabbitflow-gateway`` property.
_SERVER = f"rabbitflow-broker {__version__}"

#: Bytes the client transport may buffer before the relay stops reading upstream.
WRITE_HIGH_WATER = 1024 * 1024
_WRITE_LOW_WATER = 256 * 1024
#: Toward RabbitMQ the kernel keeps at most this much unsent (``TCP_NOTSENT_LOWAT``),
#: the transport 64 KiB more: a backlog waits in the client's socket, where its small
#: writes coalesce as they do direct (queued here, each was a segment of its own).
UPSTREAM_UNSENT = 32 * 1024
_UPSTREAM_HIGH_WATER, _UPSTREAM_LOW_WATER = 64 * 1024, 16 * 1024
_HARD_CLOSE_S = 1.0
_TOO_MANY_FILES = (errno.EMFILE, errno.ENFILE)


class Relay(EngineViews, asyncio.Protocol):
    """Relays one client connection: the protocol of the accepted client socket."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        on_closed: Callable[[Relay], None] | None = None,
        connector: Connector | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
        upstream_server_hostname: str | None = None,
        read_pause: ReadPause = OFF,
        descriptors: DescriptorWatch | None = None,
    ) -> None:
        self.gateway = gateway
        self._descriptors = descriptors
        self._on_closed = on_closed
        self._connector = connector
        self._ssl = upstream_ssl
        self._server_hostname = upstream_server_hostname
        self.number = gateway.next_connection_number()
        timeout, handshake = (
            gateway.config.flow_enforcement_timeout,
            gateway.config.handshake_timeout,
        )
        settings = EngineSettings(
            flow_enforcement_timeout=timeout / 1000 if timeout else None,
            handshake_timeout=handshake / 1000 if handshake else None,
            server=_SERVER,
        )
        # Event timestamps come from the clock the engine is given (no clock
        # reads inside it): the wall-clock time at which that clock was 0.
        epoch = gateway.now() - dt.timedelta(seconds=gateway.monotonic())
        self.engine = Engine(gateway, number=self.number, settings=settings, epoch=epoch)
        self._pump = Pump(self.engine, gateway, self, read_pause)
        if gateway.on_change is None:
            gateway.on_change = Refresher(gateway)
        # Each transport refers to its protocol (this relay, or _Upstream) until
        # it is lost: a cycle while open, which _release() leaves none of.
        self._client: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self._paused: set[str] = set()  # why the client is not read
        self._timer: asyncio.TimerHandle | None = None
        self._hard_close: asyncio.TimerHandle | None = None
        self._lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed: asyncio.Future[None] | None = None
        #: The RabbitMQ node ("host:port") this connection's upstream went to.
        self._node: str | None = None
        self._log = _log.bind(connection=self.number)

    # -- client socket -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A client connected: open the upstream connection (or refuse at once)."""
        client = self._client = self._pump.client = cast(asyncio.Transport, transport)
        host, port = (client.get_extra_info("peername") or ("?", 0))[:2]
        self.engine.remote_host, self.engine.remote_port = str(host), int(port)
        self._log = _log.bind(connection=self.number, remote=f"{host}:{port}")
        client.set_write_buffer_limits(WRITE_HIGH_WATER, _WRITE_LOW_WATER)
        if self._descriptors is not None:
            self._descriptors.opened(client)
        # Kept: asyncio.get_running_loop() costs a getpid() system call on Python 3.11.
        loop = self._pump.loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self.gateway.register(self)
        self._pump.perform(self.engine.start(self._now()))
        if self.gateway.ready_error is not None:
            self._lost.add("upstream")
            self._pump.perform(self.engine.upstream_failed(self._now(), self.gateway.ready_error))
            return
        self._pause("connecting")
        self._task = loop.create_task(self._open_upstream(), name=f"relay-{self.number}-connect")

    def data_received(self, data: bytes) -> None:
        """Bytes from the client."""
        self._pump.client_data(data)

    def eof_received(self) -> bool | None:
        """The client closed its side: end the relay."""
        self.abort()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """The client socket is closed."""
        self._side_lost("client")

    def pause_writing(self) -> None:
        """The client reads slower than RabbitMQ delivers: stop reading upstream."""
        self._set_upstream_reading(False)

    def resume_writing(self) -> None:
        """The client caught up."""
        self._set_upstream_reading(True)

    def _set_upstream_reading(self, reading: bool) -> None:
        upstream = self._upstream
        if upstream is not None and not upstream.is_closing():
            upstream.resume_reading() if reading else upstream.pause_reading()

    # -- upstream socket -----------------------------------------------------------

    async def _open_upstream(self) -> None:
        # The nodes of a RabbitMQ cluster in turn, from the next one round robin:
        # the first that answers is this connection's.
        nodes = self.gateway.upstream_nodes()
        for attempt, (host, port) in enumerate(nodes):
            try:
                transport = await self._connect_upstream(host, port)
            except (OSError, ssl.SSLError) as exc:
                if attempt + 1 < len(nodes) and not (
                    isinstance(exc, OSError) and exc.errno in _TOO_MANY_FILES
                ):
                    self._log.warning("upstream node unreachable", node=f"{host}:{port}")
                    continue
                self._upstream_unreachable(exc)
                return
            self._node = f"{host}:{port}"
            break
        if self._pump.closing:  # the client left meanwhile
            transport.close()
            return
        self._pump.perform(self.engine.upstream_connected(self._now(), self._node or ""))
        self._resume("connecting")

    async def _connect_upstream(self, host: str, port: int) -> asyncio.BaseTransport:
        if self._connector is not None:
            return await self._connector(host, port, lambda: _Upstream(self))
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(
            lambda: _Upstream(self),
            host,
            port,
            ssl=self._ssl,
            server_hostname=self._server_hostname if self._ssl else None,
        )
        return transport

    def _upstream_unreachable(self, exc: OSError | ssl.SSLError) -> None:
        if isinstance(exc, OSError) and exc.errno in _TOO_MANY_FILES:
            self._log.error("cannot open upstream connection: too many open files")
            cause = "too many open files"
        else:
            self._log.warning("upstream unreachable", error=str(exc))
            cause = f"upstream unreachable: {exc}"
        self._lost.add("upstream")
        self._pump.perform(self.engine.upstream_failed(self._now(), cause))
        self._finish_if_done()

    def _upstream_gone(self) -> None:
        """The upstream connection ended: a client still connected is told
        with 320, naming the node (it reconnects, perhaps to another node)."""
        if "client" in self._lost or self._pump.closing or self._node is None:
            self._side_lost("upstream")
            return
        self._lost.add("upstream")
        self._upstream = self._pump.upstream = None
        self._pump.perform(
            self.engine.upstream_failed(self._now(), f"upstream node {self._node} went away")
        )
        # Whatever paused the client, read its Close-Ok (or its leaving) now.
        self._paused.clear()
        if self._client is not None and not self._client.is_closing():
            self._client.resume_reading()
        self._finish_if_done()

    def _upstream_made(self, transport: asyncio.Transport) -> None:
        self._upstream = self._pump.upstream = transport
        transport.set_write_buffer_limits(_UPSTREAM_HIGH_WATER, _UPSTREAM_LOW_WATER)
        if self._descriptors is not None:
            self._descriptors.opened(transport)
        sock, option = transport.get_extra_info("socket"), getattr(socket, "TCP_NOTSENT_LOWAT", 0)
        if sock is not None and option:
            with contextlib.suppress(OSError):  # not TCP (a test's transport), or no such option
                sock.setsockopt(socket.IPPROTO_TCP, option, UPSTREAM_UNSENT)

    # -- carrying out actions --------------------------------------------------------

    def _now(self) -> float:
        return self.gateway.monotonic()

    def read_client(self, reading: bool) -> None:
        """The engine wants the client read or not (:class:`Owner`)."""
        (self._resume if reading else self._pause)("engine")

    def set_timer(self, deadline: float | None) -> None:
        """Call the engine's tick at ``deadline`` (:class:`Owner`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            delay = max(0.0, deadline - self._now())
            self._timer = asyncio.get_running_loop().call_later(delay, self._pump.tick)

    @property
    def vhost(self) -> str:
        """The vhost the client opened (``/`` until then)."""
        return self.engine.vhost

    def refresh(self) -> None:
        """Blocking changed for this connection: re-check its held confirms
        and flowed channels (called by :class:`Refresher`, outside any change)."""
        if not self._pump.closing:
            self._pump.perform(self.engine.refresh(self._now()))

    def _pause(self, reason: str) -> None:
        first = not self._paused
        self._paused.add(reason)
        if first and self._client is not None and not self._client.is_closing():
            self._client.pause_reading()

    def _resume(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if not self._paused and self._client is not None and not self._client.is_closing():
            self._client.resume_reading()

    # -- lifecycle ---------------------------------------------------------------------

    async def shutdown(
        self, text: str = "gateway shutting down", drain_timeout: float = 10.0
    ) -> None:
        """Stop taking publishes, let in-flight confirms through (up to
        ``drain_timeout`` s), then close the client with 320 ``text``."""
        self._pause("shutdown")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while self.engine.in_flight and not self._pump.closing and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if not self._pump.closing:
            self._pump.perform(self.engine.shutdown(self._now(), text))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_closed(), 2 * _HARD_CLOSE_S)
        self.abort()

    def abort(self) -> None:
        """Close both sockets (buffered bytes are still flushed, for a while)."""
        if not self._pump.closing:
            self._pump.closing = True
            if self._timer is not None:
                self._timer.cancel()
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
                self._hard_close = loop.call_later(_HARD_CLOSE_S, self._hard_abort)
        for transport in (self._client, self._upstream):
            if transport is not None and not transport.is_closing():
                transport.close()

    def _hard_abort(self) -> None:
        """A peer does not read what is left to flush: drop it."""
        if self._client is not None and "client" not in self._lost:
            self._client.abort()
        if self._upstream is not None and "upstream" not in self._lost:
            self._upstream.abort()

    def _side_lost(self, side: str) -> None:
        self._lost.add(side)
        self.abort()
        self._finish_if_done()

    def _finish_if_done(self) -> None:
        if "client" not in self._lost:
            return
        if "upstream" not in self._lost and (
            self._upstream is not None or (self._task is not None and not self._task.done())
        ):
            return
        if self._closed is None or self._closed.done():
            return
        for event in self.engine.client_gone(self._now()).events:
            self.gateway.emit(event)
        self.gateway.unregister(self)
        self._release()
        self._closed.set_result(None)
        if self._on_closed is not None:
            self._on_closed(self)

    def _release(self) -> None:
        """Both sockets are closed: cancel the timers and break the relay's
        reference cycles (pump and owner, engine and channels), so that
        reference counting frees the connection as soon as nothing holds it,
        without waiting for the cycle collector."""
        for handle in (self._timer, self._hard_close):
            if handle is not None:
                handle.cancel()
        self._timer = self._hard_close = None
        self._client = self._upstream = None
        self._pump.release()
        self.engine.release()

    async def wait_closed(self) -> None:
        """Return once both sockets are closed and the relay is unregistered."""
        if self._closed is not None:
            await asyncio.shield(self._closed)


class _Upstream(asyncio.Protocol):
    """The protocol of a relay's upstream socket: hands everything to the relay."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._relay._upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._relay._pump.upstream_data(data)

    def eof_received(self) -> bool | None:
        self._relay._upstream_gone()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if "upstream" in self._relay._lost:
            self._relay._finish_if_done()
        else:
            self._relay._upstream_gone()

    def pause_writing(self) -> None:
        self._relay._pause("upstream")

    def resume_writing(self) -> None:
        self._relay._resume("upstream")
