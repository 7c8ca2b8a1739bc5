"""One client connection relayed to one upstream RabbitMQ connection.

:class:`Relay` runs two small loops: client→upstream and upstream→client.
Each reads a chunk, splits it into frames (:mod:`~rabbitflow_broker.frames`),
lets the per-frame handlers update the gateway's machines and forwards the
original bytes of every frame it does not drop, in one write per chunk.
The handlers may drop a frame (a ``Channel.FlowOk`` from the client, a held
confirm or ``tx.commit-ok``) or add frames of the gateway's own
(``Channel.Flow``, split or released confirms, ``Channel.Close`` 406).

Frames the gateway sends on its own to a channel in the middle of a
delivered message wait until that message's last body frame is written:
AMQP forbids interleaving frames of one channel within a content.

Flow control never stops the upstream→client direction, so deliveries
keep flowing to consumers while producers are blocked (a client's own acks
wait only while its reads are paused, below).

Clients that ignore ``Channel.Flow(active=false)``: once a flowed
channel has published more than :data:`PAUSE_MESSAGES` messages or
:data:`PAUSE_BYTES` body bytes since it was flowed, the relay stops reading
the client's socket (TCP back-pressure; ``connection.blocked`` to clients
that advertise the capability) until the channel is unflowed or its
``--flow-enforcement-timeout`` has passed.  The first publish on a channel
flowed for longer than the timeout is not forwarded: the channel is closed
(CHN-1012, 406) and everything received before it still goes upstream.
While any channel of the connection is flowed, the relay reads the client
in :data:`FLOWED_READ_SIZE` chunks so the checks between reads bite early.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from pamqp import commands

from rabbitflow_broker.confirms import Confirm, ConfirmTracker
from rabbitflow_broker.depth import ChannelDeliveries
from rabbitflow_broker.events import (
    ALL_QUEUES,
    ChannelFlowEnforced,
    ChannelFlowIgnored,
    ChannelFlowRemoved,
)
from rabbitflow_broker.flow import ThresholdError
from rabbitflow_broker.frames import (
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_METHOD,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
    ContentTracker,
    FrameError,
    FrameReader,
    FrameRef,
    decode_ack,
    decode_content_header,
    decode_deliver,
    decode_method,
    decode_publish,
    encode_method,
    method_id,
)
from rabbitflow_broker.gateway import BlockedChannel, Gateway, Route
from rabbitflow_broker.routing import RoutingError

__all__ = ["FLOWED_READ_SIZE", "PAUSE_BYTES", "PAUSE_MESSAGES", "Connector", "Relay"]

#: Opens the upstream connection (``asyncio.open_connection`` by default).
Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

_log = structlog.get_logger("rabbitflow.broker.relay")

_READ_SIZE = 256 * 1024
#: Client reads while a channel of the connection is flowed.
FLOWED_READ_SIZE = 16 * 1024
#: A flowed channel may publish this many messages / body bytes before the
#: relay stops reading its connection (back-pressure).
PAUSE_MESSAGES = 2000
PAUSE_BYTES = 1024 * 1024
_INTERNAL_ERROR = 541
_CLOSE_GRACE_S = 1.0
_EMPTY: Route = frozenset()

# Synchronous requests whose *-Ok changes what the gateway knows.
_OK_OF = {
    (50, 10): (50, 11),  # queue.declare
    (50, 20): (50, 21),  # queue.bind
    (50, 50): (50, 51),  # queue.unbind
    (50, 30): (50, 31),  # queue.purge
    (50, 40): (50, 41),  # queue.delete
    (40, 10): (40, 11),  # exchange.declare
    (40, 20): (40, 21),  # exchange.delete
    (40, 30): (40, 31),  # exchange.bind
    (40, 40): (40, 51),  # exchange.unbind
    (60, 20): (60, 21),  # basic.consume
    (60, 30): (60, 31),  # basic.cancel
    (60, 70): (60, 71),  # basic.get (or get-empty)
}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value) if value is not None else ""


def persistent(payload: bytes) -> bool:
    """Whether a basic content header says delivery mode 2, without a full decode.

    The properties come in flag order: content-type and content-encoding
    (short strings) and headers (a table) precede delivery-mode.  A
    malformed header counts as transient; the frame reader and RabbitMQ
    judge it.
    """
    if len(payload) < 14:
        return False
    flags = int.from_bytes(payload[12:14], "big")
    if not flags & 0x1000:
        return False
    offset = 14
    try:
        if flags & 0x8000:
            offset += 1 + payload[offset]
        if flags & 0x4000:
            offset += 1 + payload[offset]
        if flags & 0x2000:
            offset += 4 + int.from_bytes(payload[offset : offset + 4], "big")
        return payload[offset] == 2
    except IndexError:
        return False


def _user_from_start_ok(method: commands.Connection.StartOk) -> str:
    response = method.response
    raw = response.encode("latin-1") if isinstance(response, str) else bytes(response or b"")
    if method.mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) >= 2:
            return parts[1].decode("utf-8", "replace")
    if method.mechanism == "AMQPLAIN" and b"LOGIN" in raw:
        after = raw.split(b"LOGIN", 1)[1]
        # LOGIN S <long length> <bytes>
        if len(after) >= 5:
            length = int.from_bytes(after[1:5], "big")
            return after[5 : 5 + length].decode("utf-8", "replace")
    return method.mechanism.lower() if method.mechanism else "unknown"


@dataclass
class _Channel:
    number: int
    pending: deque[tuple[tuple[int, int], Any]] = field(default_factory=deque)
    consumers: dict[str, tuple[str, bool]] = field(default_factory=dict)
    deliveries: ChannelDeliveries = field(default_factory=ChannelDeliveries)
    confirm: ConfirmTracker | None = None
    tx: bool = False
    tx_publishes: list[tuple[Route, int]] = field(default_factory=list)
    tx_removals: list[tuple[str, int]] = field(default_factory=list)
    committing: deque[tuple[list[tuple[Route, int]], list[tuple[str, int]]]] = field(
        default_factory=deque
    )
    held_commits: list[Route] = field(default_factory=list)
    publish: tuple[str, str] | None = None
    delivery: tuple[str, int, bool] | None = None  # queue, delivery tag, no_ack
    last_queue: str = ""
    blockers: dict[str, None] = field(default_factory=dict)
    # When the channel was flowed and what it published since (CHN-1012, back-pressure).
    flowed_at: float | None = None
    publishes_while_flowed: int = 0
    bytes_while_flowed: int = 0
    publisher: bool = False
    # The gateway closed it towards the client: drop client frames until CloseOk.
    closed_by_gateway: bool = False


class Relay:
    """Relays one client connection; create it per accepted socket and ``await run()``."""

    def __init__(
        self,
        gateway: Gateway,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        *,
        connect: Connector | None = None,
    ) -> None:
        self.gateway = gateway
        self._connect = connect or asyncio.open_connection
        self.number = gateway.next_connection_number()
        self._creader = client_reader
        self._cwriter = client_writer
        self._ureader: asyncio.StreamReader | None = None
        self._uwriter: asyncio.StreamWriter | None = None
        peer = client_writer.get_extra_info("peername") or ("?", 0)
        self.remote_host = str(peer[0])
        self.remote_port = int(peer[1])
        self.user = "unknown"
        self.vhost = "/"
        self._channels: dict[int, _Channel] = {}
        self._from_client = FrameReader(expect_protocol_header=True)
        self._from_upstream = FrameReader()
        self._client_content = ContentTracker()
        self._upstream_content = ContentTracker()
        self._to_client: list[bytes] = []  # injected in order while handling an upstream chunk
        self._to_upstream: list[bytes] = []
        self._deferred: list[tuple[int, bytes]] = []
        # Channels the gateway closed upstream, awaiting RabbitMQ's CloseOk:
        # frames of a client that reopens the number meanwhile wait here.
        self._upstream_closing: dict[int, list[bytes]] = {}
        self._in_upstream_chunk = False
        self._in_client_chunk = False
        # Set by refresh(): a paused client loop re-checks whether to read.
        self._resume = asyncio.Event()
        self._blocked_capable = False
        timeout_ms = gateway.config.flow_enforcement_timeout
        self._enforcement_s: float | None = timeout_ms / 1000 if timeout_ms else None
        self._log = _log.bind(
            connection=self.number, remote=f"{self.remote_host}:{self.remote_port}"
        )
        self._client_handlers: dict[tuple[int, int], Callable[[_Channel | None, int, bytes], bool]]
        self._client_handlers = {
            (10, 11): self._c_start_ok,
            (10, 31): self._c_tune_ok,
            (10, 40): self._c_open,
            (20, 10): self._c_channel_open,
            (20, 40): self._c_channel_close,
            (20, 41): self._c_channel_close_ok,
            (20, 21): self._c_flow_ok,
            (50, 10): self._c_queue_declare,
            (50, 20): self._c_sync,
            (50, 50): self._c_sync,
            (50, 30): self._c_sync,
            (50, 40): self._c_sync,
            (40, 10): self._c_sync,
            (40, 20): self._c_sync,
            (40, 30): self._c_sync,
            (40, 40): self._c_sync,
            (60, 20): self._c_sync,
            (60, 30): self._c_sync,
            (60, 70): self._c_sync,
            (60, 40): self._c_publish,
            (60, 80): self._c_ack,
            (60, 90): self._c_ack,
            (60, 120): self._c_ack,
            (60, 100): self._c_recover,
            (60, 110): self._c_recover,
            (85, 10): self._c_confirm_select,
            (90, 10): self._c_tx_select,
            (90, 20): self._c_tx_commit,
            (90, 30): self._c_tx_rollback,
        }
        self._upstream_handlers: dict[
            tuple[int, int], Callable[[_Channel | None, int, bytes], bool]
        ] = {
            (20, 40): self._u_channel_close,
            (20, 41): self._u_channel_close_ok,
            (50, 11): self._u_sync_ok,
            (50, 21): self._u_sync_ok,
            (50, 51): self._u_sync_ok,
            (50, 31): self._u_sync_ok,
            (50, 41): self._u_sync_ok,
            (40, 11): self._u_sync_ok,
            (40, 21): self._u_sync_ok,
            (40, 31): self._u_sync_ok,
            (40, 51): self._u_sync_ok,
            (60, 21): self._u_sync_ok,
            (60, 31): self._u_sync_ok,
            (60, 71): self._u_sync_ok,
            (60, 72): self._u_get_empty,
            (60, 30): self._u_cancel,
            (60, 60): self._u_deliver,
            (60, 80): self._u_confirm,
            (60, 120): self._u_confirm,
            (90, 21): self._u_commit_ok,
            (90, 31): self._u_rollback_ok,
        }

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Relay until either side closes; never raises for protocol errors."""
        host, port = self.gateway.config.upstream_address
        try:
            self._ureader, self._uwriter = await self._connect(host, port)
        except OSError as exc:
            self._log.warning("upstream unreachable", error=str(exc))
            self._cwriter.close()
            return
        self.gateway.register(self)
        tasks = [
            asyncio.create_task(self._client_loop(), name=f"relay-{self.number}-c2u"),
            asyncio.create_task(self._upstream_loop(), name=f"relay-{self.number}-u2c"),
        ]
        try:
            _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            # One side is gone: close both (buffered bytes such as a Close-Ok
            # are still flushed), which ends the other loop too.
            self.abort()
            if pending:
                await asyncio.wait(pending, timeout=_CLOSE_GRACE_S)
            for task in tasks:
                if not task.done():
                    task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        finally:
            self.gateway.unregister(self)
            self._channels.clear()
            await self._close_transports()

    def abort(self) -> None:
        """Close both sockets; :meth:`run` then returns (gateway shutdown)."""
        for writer in (self._cwriter, self._uwriter):
            if writer is not None and not writer.is_closing():
                writer.close()

    async def _close_transports(self) -> None:
        writers = [w for w in (self._cwriter, self._uwriter) if w is not None]
        for writer in writers:
            if not writer.is_closing():
                writer.close()
        for writer in writers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), _CLOSE_GRACE_S)

    async def _client_loop(self) -> None:
        assert self._uwriter is not None
        upstream = self._uwriter
        while True:
            await self._backpressure()
            read_size = FLOWED_READ_SIZE if self._any_flowed() else _READ_SIZE
            try:
                data = await self._creader.read(read_size)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            self._in_client_chunk = True
            try:
                buffer, frames = self._from_client.feed(data)
                parts = self._process(buffer, frames, self._client_frame, self._to_upstream)
            except FrameError as exc:
                await self._protocol_error(exc)
                return
            finally:
                self._in_client_chunk = False
            if parts:
                upstream.write(b"".join(parts) if len(parts) > 1 else parts[0])
                try:
                    await upstream.drain()
                except (ConnectionError, OSError):
                    return

    # -- clients that ignore flow control ---------------------------------

    def _any_flowed(self) -> bool:
        return any(ch.blockers for ch in self._channels.values())

    def _pause_until(self) -> float | None:
        """Monotonic time to stop pausing at (inf: until unflowed); None: read now."""
        until: float | None = None
        for channel in self._channels.values():
            if (
                not channel.blockers
                or channel.flowed_at is None
                or channel.closed_by_gateway
                or (
                    channel.publishes_while_flowed <= PAUSE_MESSAGES
                    and channel.bytes_while_flowed <= PAUSE_BYTES
                )
            ):
                continue
            if self._enforcement_s is None:
                candidate = float("inf")
            else:
                # Just past the timeout, so the next publish is judged ignoring flow.
                candidate = channel.flowed_at + self._enforcement_s + 0.001
            until = candidate if until is None else min(until, candidate)
        return until

    async def _backpressure(self) -> None:
        until = self._pause_until()
        if until is None or until <= self.gateway.monotonic():
            return
        self._log.info("pausing client reads: flowed channel keeps publishing")
        if self._blocked_capable:
            self._send_client(0, encode_method(0, commands.Connection.Blocked("flow control")))
        while until is not None:
            remaining = until - self.gateway.monotonic()
            if remaining <= 0:
                break
            self._resume.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._resume.wait(), None if remaining == float("inf") else remaining
                )
            until = self._pause_until()
        if self._blocked_capable:
            self._send_client(0, encode_method(0, commands.Connection.Unblocked()))
        self._log.info("resuming client reads")

    def _flow_ignored(self, channel: _Channel) -> bool:
        """Close a channel still publishing past the enforcement timeout (CHN-1012)."""
        if (
            not channel.blockers
            or channel.flowed_at is None
            or self._enforcement_s is None
            or self.gateway.monotonic() - channel.flowed_at <= self._enforcement_s
        ):
            return False
        number = channel.number
        self.gateway.emit(
            ChannelFlowIgnored(
                ts=self.gateway.now(),
                vhost=self.vhost,
                connection=self.number,
                user=self.user,
                remote_host=self.remote_host,
                remote_port=self.remote_port,
                channel=number,
            )
        )
        timeout_ms = self.gateway.config.flow_enforcement_timeout
        self.close_channel(
            number,
            PRECONDITION_FAILED,
            f"flow control ignored: still publishing {timeout_ms} ms after "
            "Channel.Flow(active=false)",
            (60, 40),
        )
        self._resume.set()
        return True

    async def _upstream_loop(self) -> None:
        assert self._ureader is not None
        client = self._cwriter
        while True:
            try:
                data = await self._ureader.read(_READ_SIZE)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            self._in_upstream_chunk = True
            try:
                buffer, frames = self._from_upstream.feed(data)
                parts = self._process(buffer, frames, self._upstream_frame, self._to_client)
            except FrameError as exc:
                self._log.error("bad frame from upstream", error=str(exc))
                client.write(
                    encode_method(
                        0, commands.Connection.Close(_INTERNAL_ERROR, "INTERNAL_ERROR", 0, 0)
                    )
                )
                return
            finally:
                self._in_upstream_chunk = False
            if self._deferred:
                parts.extend(self._take_deferred())
            if parts:
                client.write(b"".join(parts) if len(parts) > 1 else parts[0])
                try:
                    await client.drain()
                except (ConnectionError, OSError):
                    return

    async def _protocol_error(self, exc: FrameError) -> None:
        self._log.warning("closing client connection on protocol error", error=str(exc))
        if exc.code == 0:
            self._cwriter.write(PROTOCOL_HEADER)
        else:
            reply = f"{_reply_text(exc.code)} - {exc.text}"[:255]
            self._cwriter.write(encode_method(0, commands.Connection.Close(exc.code, reply, 0, 0)))
        if self._uwriter is not None and exc.code != 0:
            with contextlib.suppress(Exception):
                self._uwriter.write(
                    encode_method(0, commands.Connection.Close(200, "client protocol error", 0, 0))
                )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._cwriter.drain(), _CLOSE_GRACE_S)

    @staticmethod
    def _process(
        buffer: bytes,
        frames: list[FrameRef],
        handler: Callable[[bytes, FrameRef], bool],
        injected: list[bytes],
    ) -> list[bytes]:
        parts: list[bytes] = []
        run_start = run_end = -1
        for ref in frames:
            keep = handler(buffer, ref)
            if keep:
                if run_start < 0:
                    run_start = ref.start
                run_end = ref.end
            elif run_start >= 0:
                parts.append(buffer[run_start:run_end])
                run_start = -1
            if injected:
                if run_start >= 0:
                    parts.append(buffer[run_start:run_end])
                    run_start = -1
                parts.extend(injected)
                injected.clear()
        if run_start >= 0:
            if run_start == 0 and run_end == len(buffer):
                parts.append(buffer)
            else:
                parts.append(buffer[run_start:run_end])
        return parts

    # -- output --------------------------------------------------------------

    def _send_client(self, channel: int, data: bytes) -> None:
        """Send a frame of the gateway's own to the client, in a safe place."""
        if self._in_upstream_chunk:
            if self._upstream_content.mid_content(channel):
                self._deferred.append((channel, data))
            else:
                self._to_client.append(data)
            return
        if self._upstream_content.mid_content(channel):
            self._deferred.append((channel, data))
            return
        if not self._cwriter.is_closing():
            self._cwriter.write(data)

    def _take_deferred(self) -> list[bytes]:
        ready = [d for ch, d in self._deferred if not self._upstream_content.mid_content(ch)]
        self._deferred = [
            (ch, d) for ch, d in self._deferred if self._upstream_content.mid_content(ch)
        ]
        return ready

    # -- client -> upstream --------------------------------------------------

    def _client_frame(self, buffer: bytes, ref: FrameRef) -> bool:
        kind = ref.kind
        channel_no = ref.channel
        channel = self._channels.get(channel_no) if channel_no else None
        if kind == FRAME_BODY:
            self._client_content.body(channel_no, ref.end - ref.start - 8)
            if channel is not None and channel.closed_by_gateway:
                return False
            return self._stash(channel_no, buffer, ref)
        if kind == FRAME_HEADER:
            payload = ref.payload(buffer)
            if channel is not None and channel.publish is not None:
                info = decode_content_header(payload, want_headers=True)
                self._client_content.header(channel_no, info.body_size)
                self._published(
                    channel,
                    info.body_size,
                    info.headers,
                    self.gateway.store_quota_on and persistent(payload),
                )
            else:
                info = decode_content_header(payload, want_headers=False)
                self._client_content.header(channel_no, info.body_size)
            if channel is not None and channel.closed_by_gateway:
                return False
            return self._stash(channel_no, buffer, ref)
        if kind != FRAME_METHOD:
            return True  # protocol header, heartbeat
        ids = method_id(buffer, ref)
        self._client_content.method(channel_no, ids)
        if channel is not None and channel.closed_by_gateway:
            if ids == (20, 41):
                channel.closed_by_gateway = False
                self._forget_channel(channel_no)
            elif ids == (20, 40):  # both sides closing at once
                self._send_client(channel_no, encode_method(channel_no, commands.Channel.CloseOk()))
            return False
        if channel_no and channel is None and ids != (20, 10) and ids[0] != 10:
            raise FrameError(
                UNEXPECTED_FRAME if ids[0] in (20, 40, 50, 60, 85, 90) else FRAME_ERROR,
                f"channel {channel_no} is not open",
            )
        handler = self._client_handlers.get(ids)
        keep = True if handler is None else handler(channel, channel_no, ref.payload(buffer))
        return self._stash(channel_no, buffer, ref) if keep else False

    def _stash(self, channel_no: int, buffer: bytes, ref: FrameRef) -> bool:
        """Hold a frame of a reopened channel until RabbitMQ finished closing it."""
        stash = self._upstream_closing.get(channel_no) if channel_no else None
        if stash is None:
            return True
        stash.append(buffer[ref.start : ref.end])
        return False

    def _c_start_ok(self, _ch: _Channel | None, _n: int, payload: bytes) -> bool:
        method = decode_method(payload)
        assert isinstance(method, commands.Connection.StartOk)
        self.user = _user_from_start_ok(method)
        properties = method.client_properties or {}
        capabilities = properties.get("capabilities")
        self._blocked_capable = isinstance(capabilities, dict) and bool(
            capabilities.get("connection.blocked")
        )
        return True

    def _c_tune_ok(self, _ch: _Channel | None, _n: int, payload: bytes) -> bool:
        method = decode_method(payload)
        assert isinstance(method, commands.Connection.TuneOk)
        frame_max = method.frame_max or (1 << 31)
        self._from_client.max_frame_size = frame_max
        self._from_upstream.max_frame_size = frame_max
        return True

    def _c_open(self, _ch: _Channel | None, _n: int, payload: bytes) -> bool:
        method = decode_method(payload)
        assert isinstance(method, commands.Connection.Open)
        self.vhost = method.virtual_host or "/"
        self._log = self._log.bind(user=self.user, vhost=self.vhost)
        return True

    def _c_channel_open(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        if channel is not None:
            raise FrameError(504, f"channel {number} already open")
        self._channels[number] = _Channel(number)
        return True

    def _c_channel_close(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        if channel is not None:
            channel.deliveries.requeue_all()
        return True

    def _c_channel_close_ok(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        self._forget_channel(number)
        return True

    def _c_flow_ok(self, _ch: _Channel | None, _n: int, _p: bytes) -> bool:
        # Answers the gateway's own Channel.Flow; RabbitMQ never sent one.
        return False

    def _c_queue_declare(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        method = decode_method(payload)
        assert isinstance(method, commands.Queue.Declare)
        arguments = dict(method.arguments or {})
        if not method.passive:
            try:
                self.gateway.validate_declare(arguments)
            except ThresholdError as exc:
                self._log.info("refusing declare", channel=number, reason=str(exc))
                self.close_channel(number, PRECONDITION_FAILED, str(exc), (50, 10))
                return False
        info = (method.queue, arguments, method.passive)
        if method.nowait:
            self._apply_ok(channel, (50, 11), info, commands.Queue.DeclareOk(method.queue))
        else:
            channel.pending.append(((50, 11), info))
        return True

    def close_channel(
        self, number: int, code: int, text: str, ids: tuple[int, int] = (0, 0)
    ) -> None:
        """Close one channel towards the client and upstream; the rest go on.

        Used for refused declares and for channels that ignore
        flow control (CHN-1012).  Frames the client still sends on the
        channel are dropped until its ``Channel.CloseOk``; a reopen of the
        number waits until RabbitMQ has closed its side.
        """
        channel = self._channels.get(number)
        if channel is None or channel.closed_by_gateway:
            return
        reply = f"{_reply_text(code)} - {text}"[:255]
        self._send_client(
            number, encode_method(number, commands.Channel.Close(code, reply, ids[0], ids[1]))
        )
        upstream_close = encode_method(
            number, commands.Channel.Close(200, "closed by gateway", 0, 0)
        )
        if self._in_client_chunk:
            self._to_upstream.append(upstream_close)
        elif self._uwriter is not None and not self._uwriter.is_closing():
            self._uwriter.write(upstream_close)
        if channel.blockers:
            channel.blockers.clear()
        channel.closed_by_gateway = True
        self._upstream_closing[number] = []
        channel.deliveries.requeue_all()

    def _c_sync(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        method = decode_method(payload)
        ok = _OK_OF[(method.index >> 16, method.index & 0xFFFF)]
        nowait = bool(getattr(method, "nowait", False))
        if nowait:
            self._apply_ok(channel, ok, method, None)
        else:
            channel.pending.append((ok, method))
        return True

    def _c_publish(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        if self._flow_ignored(channel):
            return False
        publish = decode_publish(payload)
        channel.publish = (publish.exchange, publish.routing_key)
        return True

    def _published(
        self,
        channel: _Channel,
        size: int,
        headers: dict[str, object] | None,
        is_persistent: bool = False,
    ) -> None:
        assert channel.publish is not None
        exchange, routing_key = channel.publish
        channel.publish = None
        channel.publisher = True
        if channel.blockers:
            channel.publishes_while_flowed += 1
            channel.bytes_while_flowed += size
        vhost = self.vhost
        try:
            route = self.gateway.routing.route(vhost, exchange, routing_key, headers)
        except RoutingError:
            route = _EMPTY
        if is_persistent and route:
            # Counted at publish even in a transaction: early, never late.
            self.gateway.persistent_published(vhost, size * len(route))
        if channel.tx:
            channel.tx_publishes.append((route, size))
        elif route:
            self.gateway.published(vhost, route, size)
        if channel.confirm is not None:
            channel.confirm.published(route)
        if route or self.gateway.vhost_blocked(vhost):
            self._block_on(channel, route)

    def _c_ack(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        ids = (60, int.from_bytes(payload[2:4], "big"))
        ack = decode_ack(payload, ids)
        settled = channel.deliveries.settle(ack.delivery_tag, ack.multiple)
        if ids != (60, 80) and ack.requeue:
            return True
        for delivery in settled:
            if channel.tx:
                channel.tx_removals.append((delivery.queue, delivery.size))
            else:
                self.gateway.removed(self.vhost, delivery.queue, 1, delivery.size)
        return True

    def _c_recover(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        channel.deliveries.requeue_all()
        return True

    def _c_confirm_select(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        if channel.confirm is None:
            channel.confirm = ConfirmTracker()
        return True

    def _c_tx_select(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        channel.tx = True
        return True

    def _c_tx_commit(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        channel.committing.append((channel.tx_publishes, channel.tx_removals))
        channel.tx_publishes, channel.tx_removals = [], []
        return True

    def _c_tx_rollback(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        channel.tx_publishes, channel.tx_removals = [], []
        return True

    # -- upstream -> client --------------------------------------------------

    def _upstream_frame(self, buffer: bytes, ref: FrameRef) -> bool:
        kind = ref.kind
        channel_no = ref.channel
        if channel_no in self._upstream_closing:
            return self._upstream_closing_frame(buffer, ref)
        channel = self._channels.get(channel_no) if channel_no else None
        if kind == FRAME_BODY:
            self._upstream_content.body(channel_no, ref.end - ref.start - 8)
            return True
        if kind == FRAME_HEADER:
            info = decode_content_header(ref.payload(buffer), want_headers=False)
            self._upstream_content.header(channel_no, info.body_size)
            if channel is not None and channel.delivery is not None:
                queue, tag, no_ack = channel.delivery
                channel.delivery = None
                if no_ack:
                    self.gateway.removed(self.vhost, queue, 1, info.body_size)
                else:
                    channel.deliveries.delivered(tag, queue, info.body_size)
            return True
        if kind != FRAME_METHOD:
            return True
        ids = method_id(buffer, ref)
        self._upstream_content.method(channel_no, ids)
        handler = self._upstream_handlers.get(ids)
        if handler is None or (channel_no and channel is None):
            return True
        return handler(channel, channel_no, ref.payload(buffer))

    def _upstream_closing_frame(self, buffer: bytes, ref: FrameRef) -> bool:
        """Swallow what RabbitMQ still sends on a channel the gateway closed."""
        channel_no = ref.channel
        if ref.kind == FRAME_BODY:
            self._upstream_content.body(channel_no, ref.end - ref.start - 8)
        elif ref.kind == FRAME_HEADER:
            info = decode_content_header(ref.payload(buffer), want_headers=False)
            self._upstream_content.header(channel_no, info.body_size)
        elif ref.kind == FRAME_METHOD:
            ids = method_id(buffer, ref)
            self._upstream_content.method(channel_no, ids)
            if ids == (20, 41):
                stash = self._upstream_closing.pop(channel_no)
                if stash and self._uwriter is not None:
                    self._uwriter.write(b"".join(stash))
        return False

    def _u_channel_close(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        if channel is not None:
            channel.deliveries.requeue_all()
            channel.pending.clear()
        return True

    def _u_channel_close_ok(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        self._forget_channel(number)
        return True

    def _pop_pending(self, channel: _Channel, ok: tuple[int, int]) -> Any:
        while channel.pending:
            expected, info = channel.pending.popleft()
            if expected == ok:
                return info
        return None

    def _u_sync_ok(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        ok = (int.from_bytes(payload[:2], "big"), int.from_bytes(payload[2:4], "big"))
        info = self._pop_pending(channel, ok)
        if info is None:
            return True
        self._apply_ok(channel, ok, info, decode_method(payload))
        return True

    def _u_get_empty(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        self._pop_pending(channel, (60, 71))
        return True

    def _apply_ok(self, channel: _Channel, ok: tuple[int, int], info: Any, reply: Any) -> None:
        gateway = self.gateway
        routing = gateway.routing
        vhost = self.vhost
        try:
            if ok == (50, 11):
                name, arguments, passive = info
                queue = _text(reply.queue) if reply is not None else name
                channel.last_queue = queue
                if passive:
                    if not gateway.knows_queue(vhost, queue):
                        routing.declare_queue(vhost, queue, None)
                        gateway.queue_declared(vhost, queue, None)
                else:
                    routing.declare_queue(vhost, queue, arguments)
                    gateway.queue_declared(vhost, queue, arguments)
                gateway.routing_version += 1
                return
            method = info
            if ok == (50, 21):
                routing.bind_queue(
                    vhost,
                    method.queue or channel.last_queue,
                    method.exchange,
                    method.routing_key,
                    dict(method.arguments or {}),
                )
            elif ok == (50, 51):
                routing.unbind_queue(
                    vhost,
                    method.queue or channel.last_queue,
                    method.exchange,
                    method.routing_key,
                    dict(method.arguments or {}),
                )
            elif ok == (50, 31):
                if reply is not None:
                    gateway.purged(vhost, method.queue or channel.last_queue, reply.message_count)
                return
            elif ok == (50, 41):
                queue = method.queue or channel.last_queue
                routing.delete_queue(vhost, queue)
                gateway.queue_deleted(vhost, queue)
            elif ok == (40, 11):
                if not method.passive:
                    arguments = dict(method.arguments or {})
                    routing.declare_exchange(
                        vhost,
                        method.exchange,
                        method.exchange_type,
                        arguments,
                        internal=bool(method.internal),
                    )
            elif ok == (40, 21):
                routing.delete_exchange(vhost, method.exchange)
            elif ok == (40, 31):
                routing.bind_exchange(
                    vhost,
                    method.destination,
                    method.source,
                    method.routing_key,
                    dict(method.arguments or {}),
                )
            elif ok == (40, 51):
                routing.unbind_exchange(
                    vhost,
                    method.destination,
                    method.source,
                    method.routing_key,
                    dict(method.arguments or {}),
                )
            elif ok == (60, 21):
                tag = _text(reply.consumer_tag) if reply is not None else method.consumer_tag
                channel.consumers[tag] = (method.queue or channel.last_queue, bool(method.no_ack))
                return
            elif ok == (60, 31):
                channel.consumers.pop(method.consumer_tag, None)
                return
            elif ok == (60, 71):
                channel.delivery = (
                    method.queue or channel.last_queue,
                    reply.delivery_tag,
                    bool(method.no_ack),
                )
                return
            gateway.routing_version += 1
        except RoutingError as exc:
            # The mirror is stale; the periodic snapshot repairs it.
            self._log.debug("routing mirror out of date", error=str(exc))

    def _u_cancel(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        method = decode_method(payload)
        assert isinstance(method, commands.Basic.Cancel)
        channel.consumers.pop(_text(method.consumer_tag), None)
        return True

    def _u_deliver(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        deliver = decode_deliver(payload)
        consumer = channel.consumers.get(deliver.consumer_tag)
        if consumer is not None:
            channel.delivery = (consumer[0], deliver.delivery_tag, consumer[1])
        return True

    def _u_confirm(self, channel: _Channel | None, number: int, payload: bytes) -> bool:
        assert channel is not None
        tracker = channel.confirm
        if tracker is None:
            return True
        ids = (60, int.from_bytes(payload[2:4], "big"))
        ack = decode_ack(payload, ids)
        if ids == (60, 80):
            confirms, held = tracker.upstream_ack(
                ack.delivery_tag, ack.multiple, self.gateway.route_blocker(self.vhost)
            )
            # A held confirm flows the channel that published it too, even
            # if it has not published since the queue filled up.
            for route in held:
                self._block_on(channel, route)
        else:
            confirms, routes = tracker.upstream_nack(ack.delivery_tag, ack.multiple)
            # A nacked publish was not enqueued (e.g. reject-publish overflow).
            for route in routes:
                for queue in route:
                    self.gateway.removed(self.vhost, queue, 1, 0)
        if (
            len(confirms) == 1
            and confirms[0].tag == ack.delivery_tag
            and confirms[0].multiple == ack.multiple
        ):
            return True
        for confirm in confirms:
            self._to_client.append(_confirm_frame(number, confirm))
        return False

    def _u_commit_ok(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        assert channel is not None
        if not channel.committing:
            return True
        publishes, removals = channel.committing.popleft()
        route: set[str] = set()
        for queues, size in publishes:
            if queues:
                self.gateway.published(self.vhost, queues, size)
                route.update(queues)
        for queue, size in removals:
            self.gateway.removed(self.vhost, queue, 1, size)
        frozen = frozenset(route)
        if frozen and self.gateway.route_blocker(self.vhost)(frozen):
            channel.held_commits.append(frozen)
            self._block_on(channel, frozen)
            return False
        if channel.held_commits:
            # Keep commit-oks in order behind a held one.
            channel.held_commits.append(_EMPTY)
            return False
        return True

    def _u_rollback_ok(self, channel: _Channel | None, number: int, _p: bytes) -> bool:
        return True

    # -- blocking ------------------------------------------------------------

    def _block_on(self, channel: _Channel, route: Route) -> None:
        """Record every blocker of a route; the first one flows the channel."""
        for blocker in self.gateway.blockers(self.vhost, route):
            if blocker not in channel.blockers:
                self._block(channel, blocker)

    def _block(self, channel: _Channel, blocker: str) -> None:
        first = not channel.blockers
        channel.blockers[blocker] = None
        if not first:
            return
        number = channel.number
        channel.flowed_at = self.gateway.monotonic()
        channel.publishes_while_flowed = 0
        channel.bytes_while_flowed = 0
        self._send_client(number, encode_method(number, commands.Channel.Flow(active=False)))
        self.gateway.emit(
            ChannelFlowEnforced(
                ts=self.gateway.now(),
                vhost=self.vhost,
                connection=self.number,
                user=self.user,
                remote_host=self.remote_host,
                remote_port=self.remote_port,
                channel=number,
                queue=blocker,
            )
        )

    def refresh(self) -> None:
        """Release what no longer needs holding; unflow freed channels."""
        gateway = self.gateway
        vhost = self.vhost
        blocked = gateway.route_blocker(vhost)
        vhost_blocked = gateway.vhost_blocked(vhost)
        for channel in list(self._channels.values()):
            if channel.closed_by_gateway or channel.number in self._upstream_closing:
                continue
            number = channel.number
            if channel.confirm is not None and channel.confirm.held:
                for confirm in channel.confirm.release(blocked):
                    self._send_client(number, _confirm_frame(number, confirm))
            while channel.held_commits and not blocked(channel.held_commits[0]):
                channel.held_commits.pop(0)
                self._send_client(number, encode_method(number, commands.Tx.CommitOk()))
            if vhost_blocked and channel.publisher:
                self._block(channel, ALL_QUEUES)
            if channel.blockers:
                for blocker in list(channel.blockers):
                    if not gateway.blocker_active(vhost, blocker):
                        del channel.blockers[blocker]
                if not channel.blockers:
                    self._unblock(channel)
        self._resume.set()

    def _unblock(self, channel: _Channel) -> None:
        number = channel.number
        channel.flowed_at = None
        self._send_client(number, encode_method(number, commands.Channel.Flow(active=True)))
        self.gateway.emit(
            ChannelFlowRemoved(
                ts=self.gateway.now(),
                vhost=self.vhost,
                connection=self.number,
                user=self.user,
                remote_host=self.remote_host,
                remote_port=self.remote_port,
                channel=number,
            )
        )

    def _forget_channel(self, number: int) -> None:
        self._channels.pop(number, None)
        self._client_content.reset(number)
        self._deferred = [(ch, d) for ch, d in self._deferred if ch != number]

    # -- views ---------------------------------------------------------------

    def blocked_channels(self) -> Iterable[BlockedChannel]:
        """Channels of this connection currently flowed."""
        for channel in self._channels.values():
            if channel.blockers:
                yield BlockedChannel(
                    connection=self.number,
                    channel=channel.number,
                    user=self.user,
                    remote=f"{self.remote_host}:{self.remote_port}",
                    vhost=self.vhost,
                    blocked_on=tuple(channel.blockers),
                )

    def held_confirms(self) -> int:
        """Confirms and commit-oks currently held from the client."""
        return sum(
            (channel.confirm.held if channel.confirm is not None else 0) + len(channel.held_commits)
            for channel in self._channels.values()
        )

    def channel_count(self) -> int:
        """Open channels."""
        return len(self._channels)

    def describe_channels(self) -> Iterable[dict[str, Any]]:
        """Admin API view of this connection's channels."""
        for channel in self._channels.values():
            yield {
                "connection": self.number,
                "channel": channel.number,
                "user": self.user,
                "remote": f"{self.remote_host}:{self.remote_port}",
                "vhost": self.vhost,
                "flowStopped": bool(channel.blockers),
                "blockedOn": list(channel.blockers),
                "confirmMode": channel.confirm is not None,
                "transactional": channel.tx,
                "heldConfirms": channel.confirm.held if channel.confirm else 0,
                "heldCommits": len(channel.held_commits),
                "unackedDeliveries": len(channel.deliveries),
                "consumers": len(channel.consumers),
            }


def _confirm_frame(channel: int, confirm: Confirm) -> bytes:
    if confirm.ack:
        return encode_method(channel, commands.Basic.Ack(confirm.tag, confirm.multiple))
    return encode_method(channel, commands.Basic.Nack(confirm.tag, confirm.multiple, False))


_REPLY_TEXT = {
    FRAME_ERROR: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
}


def _reply_text(code: int) -> str:
    return _REPLY_TEXT.get(code, "INTERNAL_ERROR")
