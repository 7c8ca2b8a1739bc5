"""One client connection relayed to one upstream RabbitMQ connection.

:class:`Relay` is the asyncio protocol of a client socket; it opens one
upstream connection (:class:`_Upstream`, a protocol too) and relays bytes
both ways from the transports' callbacks, with no task or stream in
between.  Each chunk read is split into frames
(:mod:`~rabbitflow_broker.frames`), the per-frame handlers update the
gateway's machines, and the original bytes of every frame not dropped go
out in one write per chunk.  The handlers may drop a frame (a
``Channel.FlowOk`` from the client, a held confirm or ``tx.commit-ok``) or
add frames of the gateway's own (``Channel.Flow``, split or released
confirms, ``Channel.Close`` 406).

Frames the gateway sends on its own to a channel in the middle of a
delivered message wait until that message's last body frame is written:
AMQP forbids interleaving frames of one channel within a content; later
frames of the gateway's own for that channel wait behind them, so a
channel's frames keep their order.

Flow control never stops the upstream→client direction, so deliveries
keep flowing to consumers while producers are blocked (a client's own acks
wait only while its reads are paused, below).  TCP back-pressure is passed
through: while one side's transport buffers more than
:data:`WRITE_HIGH_WATER` bytes, the relay stops reading the other side.

Clients that ignore ``Channel.Flow(active=false)``: once a flowed channel
has published more than :data:`PAUSE_MESSAGES` messages or
:data:`PAUSE_BYTES` body bytes since it was flowed, the relay stops reading
the client's socket right after that message (what is left of the chunk
waits, unparsed; ``connection.blocked`` goes to clients that advertise the
capability) until the channel is unflowed or its
``--flow-enforcement-timeout`` has passed.  The first publish on a channel
flowed for longer than the timeout is not forwarded: the channel is closed
(CHN-1012, 406) and everything received before it still goes upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

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
    whole_message,
)
from rabbitflow_broker.gateway import BlockedChannel, Gateway, Route
from rabbitflow_broker.routing import RoutingError

__all__ = ["PAUSE_BYTES", "PAUSE_MESSAGES", "WRITE_HIGH_WATER", "Connector", "Relay"]

#: Opens the upstream connection: called with the address and a protocol
#: factory, returns the transport (``loop.create_connection`` by default).
Connector = Callable[[str, int, Callable[[], asyncio.Protocol]], Awaitable[asyncio.BaseTransport]]

_log = structlog.get_logger("rabbitflow.broker.relay")

#: Bytes a transport may buffer before the relay stops reading the other side.
WRITE_HIGH_WATER = 1024 * 1024
_WRITE_LOW_WATER = 256 * 1024
#: A flowed channel may publish this many messages / body bytes before the
#: relay stops reading its connection (back-pressure).
PAUSE_MESSAGES = 2000
PAUSE_BYTES = 1024 * 1024
_INTERNAL_ERROR = 541
_CLOSE_GRACE_S = 1.0
_EMPTY: Route = frozenset()
_PUBLISH = (60, 40)
_DELIVER = (60, 60)

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


class Relay(asyncio.Protocol):
    """Relays one client connection: the protocol of the accepted client socket.

    The server creates one per connection (``loop.create_server(lambda:
    Relay(gateway), ...)``); :meth:`connection_made` opens the upstream
    connection and :meth:`wait_closed` returns when both sockets are closed.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        connect: Connector | None = None,
        on_closed: Callable[[Relay], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self._connect = connect
        self._on_closed = on_closed
        self._registered = False
        self.number = gateway.next_connection_number()
        self._client: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self.remote_host = "?"
        self.remote_port = 0
        self.user = "unknown"
        self.vhost = "/"
        self._channels: dict[int, _Channel] = {}
        self._from_client = FrameReader(expect_protocol_header=True)
        self._from_upstream = FrameReader()
        self._client_content = ContentTracker()
        self._upstream_content = ContentTracker()
        self._to_client: list[bytes] = []  # injected in order while handling an upstream chunk
        self._to_upstream: list[bytes] = []
        self._early: list[bytes] = []  # client bytes read before the upstream was open
        self._deferred: list[tuple[int, bytes]] = []
        # Channels the gateway closed upstream, awaiting RabbitMQ's CloseOk:
        # frames of a client that reopens the number meanwhile wait here.
        self._upstream_closing: dict[int, list[bytes]] = {}
        self._in_upstream_chunk = False
        self._in_client_chunk = False
        # Why the client socket is not read: "connecting", "upstream" (its
        # buffer is full), "flow" (a flowed channel past the bound).
        self._client_paused: set[str] = set()
        # Set while a client chunk is parsed: stop after the current message.
        self._stop_reading = False
        self._stop_channel = 0
        self._flow_timer: asyncio.TimerHandle | None = None
        self._resume_scheduled = False
        self._closing = False
        self._lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed: asyncio.Future[None] | None = None
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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A client connected: hold its bytes until the upstream connection is open."""
        client = cast(asyncio.Transport, transport)
        self._client = client
        peer = client.get_extra_info("peername") or ("?", 0)
        self.remote_host = str(peer[0])
        self.remote_port = int(peer[1])
        self._log = _log.bind(
            connection=self.number, remote=f"{self.remote_host}:{self.remote_port}"
        )
        client.set_write_buffer_limits(WRITE_HIGH_WATER, _WRITE_LOW_WATER)
        self._pause_client("connecting")
        loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._task = loop.create_task(self._open_upstream(), name=f"relay-{self.number}-connect")

    async def _open_upstream(self) -> None:
        host, port = self.gateway.config.upstream_address
        try:
            if self._connect is not None:
                transport = await self._connect(host, port, self._upstream_protocol)
            else:
                loop = asyncio.get_running_loop()
                transport, _protocol = await loop.create_connection(
                    self._upstream_protocol, host, port
                )
        except OSError as exc:
            self._log.warning("upstream unreachable", error=str(exc))
            self._lost.add("upstream")
            self.abort()
            self._finish_if_done()
            return
        if self._closing:  # the client left meanwhile
            transport.close()
            return
        self.gateway.register(self)
        self._registered = True
        if self._early:
            early, self._early = b"".join(self._early), []
            self._client_chunk(early)
        self._resume_client("connecting")

    def _upstream_protocol(self) -> asyncio.Protocol:
        return _Upstream(self)

    def _upstream_made(self, transport: asyncio.Transport) -> None:
        self._upstream = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER, _WRITE_LOW_WATER)

    def data_received(self, data: bytes) -> None:
        """Bytes from the client."""
        self._client_chunk(data)

    def eof_received(self) -> bool | None:
        """The client closed its side: end the relay."""
        self.abort()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """The client socket is closed."""
        self._side_lost("client")

    def pause_writing(self) -> None:
        """The client reads slower than RabbitMQ delivers: stop reading upstream."""
        if self._upstream is not None and not self._upstream.is_closing():
            self._upstream.pause_reading()

    def resume_writing(self) -> None:
        """The client caught up."""
        if self._upstream is not None and not self._upstream.is_closing():
            self._upstream.resume_reading()

    def abort(self) -> None:
        """Close both sockets (buffered bytes are still flushed, for a while)."""
        if not self._closing:
            self._closing = True
            if self._flow_timer is not None:
                self._flow_timer.cancel()
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, self._hard_abort)
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
        if self._registered:
            self.gateway.unregister(self)
            self._registered = False
        self._channels.clear()
        self._closed.set_result(None)
        if self._on_closed is not None:
            self._on_closed(self)

    async def wait_closed(self) -> None:
        """Return once both sockets are closed and the relay is unregistered."""
        if self._closed is not None:
            await asyncio.shield(self._closed)

    # -- reading the client ------------------------------------------------

    def _pause_client(self, reason: str) -> None:
        first = not self._client_paused
        self._client_paused.add(reason)
        if first and self._client is not None and not self._client.is_closing():
            self._client.pause_reading()

    def _resume_client(self, reason: str) -> None:
        if reason not in self._client_paused:
            return
        self._client_paused.discard(reason)
        if self._client_paused or self._client is None or self._client.is_closing():
            return
        if self._from_client.holding:
            # Parse what was left of the paused chunk before reading more.
            self._schedule_held()
        else:
            self._client.resume_reading()

    def _schedule_held(self) -> None:
        if not self._resume_scheduled:
            self._resume_scheduled = True
            asyncio.get_running_loop().call_soon(self._parse_held)

    def _parse_held(self) -> None:
        self._resume_scheduled = False
        if self._closing or self._client_paused:
            return
        self._client_chunk(b"")
        if (
            not self._client_paused
            and not self._from_client.holding
            and self._client is not None
            and not self._client.is_closing()
        ):
            self._client.resume_reading()

    def _client_chunk(self, data: bytes) -> None:
        upstream = self._upstream
        if self._closing:
            return
        if upstream is None:
            # uvloop starts reading after connection_made, whatever it paused:
            # keep what comes before the upstream connection is open.
            if data:
                self._early.append(data)
            if self._client is not None and not self._client.is_closing():
                self._client.pause_reading()
            return
        self._in_client_chunk = True
        try:
            buffer, frames = self._from_client.feed(data)
            parts = self._process_client(buffer, frames)
        except FrameError as exc:
            self._protocol_error(exc)
            return
        except Exception:
            self._log.exception("relay failed")
            self.abort()
            return
        finally:
            self._in_client_chunk = False
        if parts and not upstream.is_closing():
            upstream.write(b"".join(parts) if len(parts) > 1 else parts[0])
        self._update_reading()

    def _process_client(self, buffer: bytes, frames: list[FrameRef]) -> list[bytes]:
        """:meth:`_process` for client frames, stopping after the message that
        took a flowed channel past the back-pressure bound (the rest of the
        chunk stays in the frame reader)."""
        self._stop_reading = False
        parts = self._process(
            buffer,
            frames,
            self._client_frame,
            self._to_upstream,
            stop=self._stop,
            message=self._client_message,
        )
        self._stop_reading = False
        return parts

    def _stop(self, buffer: bytes, frames: list[FrameRef], index: int) -> bool:
        if not self._stop_reading or self._client_content.mid_content(self._stop_channel):
            return False
        rest = frames[index + 1 :]
        if rest:
            self._from_client.unread(buffer[rest[0].start : rest[-1].end])
        return True

    # -- clients that ignore flow control ---------------------------------

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

    def _update_reading(self) -> None:
        """Pause or resume reading the client for flowed channels past the bound."""
        if self._closing or self._client is None:
            return
        if self._flow_timer is not None:
            self._flow_timer.cancel()
            self._flow_timer = None
        now = self.gateway.monotonic()
        until = self._pause_until()
        if until is not None and until > now:
            if "flow" not in self._client_paused:
                self._log.info("pausing client reads: flowed channel keeps publishing")
                if self._blocked_capable:
                    self._send_client(
                        0, encode_method(0, commands.Connection.Blocked("flow control"))
                    )
                self._pause_client("flow")
            if until != float("inf"):
                self._flow_timer = asyncio.get_running_loop().call_later(
                    until - now, self._update_reading
                )
            return
        if "flow" in self._client_paused:
            if self._blocked_capable:
                self._send_client(0, encode_method(0, commands.Connection.Unblocked()))
            self._log.info("resuming client reads")
            self._resume_client("flow")
        elif self._from_client.holding and not self._client_paused:
            self._schedule_held()

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
        return True

    def _upstream_chunk(self, data: bytes) -> None:
        client = self._client
        if self._closing or client is None:
            return
        self._in_upstream_chunk = True
        try:
            buffer, frames = self._from_upstream.feed(data)
            parts = self._process(
                buffer,
                frames,
                self._upstream_frame,
                self._to_client,
                message=self._upstream_message,
            )
        except FrameError as exc:
            self._log.error("bad frame from upstream", error=str(exc))
            client.write(
                encode_method(0, commands.Connection.Close(_INTERNAL_ERROR, "INTERNAL_ERROR", 0, 0))
            )
            self.abort()
            return
        except Exception:
            self._log.exception("relay failed")
            self.abort()
            return
        finally:
            self._in_upstream_chunk = False
        if self._deferred:
            parts.extend(self._take_deferred())
        if parts and not client.is_closing():
            client.write(b"".join(parts) if len(parts) > 1 else parts[0])

    def _protocol_error(self, exc: FrameError) -> None:
        self._log.warning("closing client connection on protocol error", error=str(exc))
        client = self._client
        if client is not None and not client.is_closing():
            if exc.code == 0:
                client.write(PROTOCOL_HEADER)
            else:
                reply = f"{_reply_text(exc.code)} - {exc.text}"[:255]
                client.write(encode_method(0, commands.Connection.Close(exc.code, reply, 0, 0)))
        upstream = self._upstream
        if upstream is not None and exc.code != 0 and not upstream.is_closing():
            upstream.write(
                encode_method(0, commands.Connection.Close(200, "client protocol error", 0, 0))
            )
        self.abort()

    @staticmethod
    def _process(
        buffer: bytes,
        frames: list[FrameRef],
        handler: Callable[[bytes, FrameRef], bool],
        injected: list[bytes],
        *,
        stop: Callable[[bytes, list[FrameRef], int], bool] | None = None,
        message: Callable[[bytes, list[FrameRef], int], int] | None = None,
    ) -> list[bytes]:
        """Run ``handler`` over the frames; return the bytes to forward, in order.

        ``message``, when given, may take a whole message at once (its
        method, header and body frames, all forwarded): it returns how many
        frames it took, 0 to leave the frame to ``handler``.
        """
        parts: list[bytes] = []
        run_start = run_end = -1
        index, count = 0, len(frames)
        while index < count:
            ref = frames[index]
            taken = message(buffer, frames, index) if message is not None else 0
            if taken:
                keep = True
                index += taken - 1
                end = frames[index].end
            else:
                keep = handler(buffer, ref)
                end = ref.end
            if keep:
                if run_start < 0:
                    run_start = ref.start
                run_end = end
            elif run_start >= 0:
                parts.append(buffer[run_start:run_end])
                run_start = -1
            if injected:
                if run_start >= 0:
                    parts.append(buffer[run_start:run_end])
                    run_start = -1
                parts.extend(injected)
                injected.clear()
            if stop is not None and stop(buffer, frames, index):
                break
            index += 1
        if run_start >= 0:
            if run_start == 0 and run_end == len(buffer):
                parts.append(buffer)
            else:
                parts.append(buffer[run_start:run_end])
        return parts

    def _whole(
        self,
        buffer: bytes,
        frames: list[FrameRef],
        index: int,
        ids: tuple[int, int],
        content: ContentTracker,
    ) -> tuple[_Channel, int] | None:
        """The channel and body size when ``frames[index]`` starts a whole
        ``ids`` message on an open channel in a plain state; None otherwise."""
        ref = frames[index]
        if ref.kind != FRAME_METHOD or method_id(buffer, ref) != ids:
            return None
        channel_no = ref.channel
        channel = self._channels.get(channel_no) if channel_no else None
        if (
            channel is None
            or channel_no in self._upstream_closing
            or content.mid_content(channel_no)
        ):
            return None
        size = whole_message(buffer, frames, index)
        return None if size < 0 else (channel, size)

    def _client_message(self, buffer: bytes, frames: list[FrameRef], index: int) -> int:
        """A whole publish on an unflowed channel, as one unit (see :meth:`_process`).

        Does what :meth:`_client_frame` does for its three frames, without
        the per-frame bookkeeping; anything unusual is left to it.
        """
        found = self._whole(buffer, frames, index, _PUBLISH, self._client_content)
        if found is None:
            return 0
        channel, _size = found
        if channel.blockers or channel.closed_by_gateway:
            return 0
        self._start_publish(channel, frames[index].payload(buffer))
        self._publish_header(channel, frames[index + 1].payload(buffer))
        return 3

    def _upstream_message(self, buffer: bytes, frames: list[FrameRef], index: int) -> int:
        """A whole delivery, as one unit (see :meth:`_process`).

        Does what :meth:`_upstream_frame` does for its three frames, without
        the per-frame bookkeeping; anything unusual is left to it.
        """
        found = self._whole(buffer, frames, index, _DELIVER, self._upstream_content)
        if found is None:
            return 0
        channel, size = found
        self._u_deliver(channel, channel.number, frames[index].payload(buffer))
        self._delivered(channel, size)
        return 3

    # -- output --------------------------------------------------------------

    def _send_client(self, channel: int, data: bytes) -> None:
        """Send a frame of the gateway's own to the client, in a safe place.

        A frame for a channel in the middle of a delivered message waits
        until the message is written, and so does every later frame for
        that channel: a channel's frames never overtake each other.
        """
        deferred = self._deferred
        if self._upstream_content.mid_content(channel) or (
            deferred and any(waiting == channel for waiting, _ in deferred)
        ):
            deferred.append((channel, data))
            return
        if self._in_upstream_chunk:
            self._to_client.append(data)
            return
        client = self._client
        if client is not None and not client.is_closing():
            client.write(data)

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
                self._client_content.header(channel_no, self._publish_header(channel, payload))
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
        elif self._upstream is not None and not self._upstream.is_closing():
            self._upstream.write(upstream_close)
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
        self._start_publish(channel, payload)
        return True

    def _start_publish(self, channel: _Channel, payload: bytes) -> None:
        """Note where the channel's publish goes, until its header gives the size.

        Raises:
            FrameError: malformed Basic.Publish.
        """
        publish = decode_publish(payload)
        channel.publish = (publish.exchange, publish.routing_key)

    def _publish_header(self, channel: _Channel, payload: bytes) -> int:
        """The content header of the channel's publish: account for the
        message (:meth:`_published`); returns its body size.

        Raises:
            FrameError: malformed header.
        """
        info = decode_content_header(payload, want_headers=True)
        self._published(
            channel,
            info.body_size,
            info.headers,
            self.gateway.store_quota_on and persistent(payload),
        )
        return info.body_size

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
            if (
                channel.publishes_while_flowed > PAUSE_MESSAGES
                or channel.bytes_while_flowed > PAUSE_BYTES
            ) and (self._pause_until() or 0.0) > self.gateway.monotonic():
                # Parse no further than this message; _update_reading pauses.
                self._stop_reading = True
                self._stop_channel = channel.number
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
            if channel is not None:
                self._delivered(channel, info.body_size)
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
                if stash and self._upstream is not None and not self._upstream.is_closing():
                    self._upstream.write(b"".join(stash))
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

    def _delivered(self, channel: _Channel, size: int) -> None:
        """The content header of a delivery announced on the channel (Deliver
        or Get-Ok to a known consumer) gave its size: count it."""
        if channel.delivery is None:
            return
        queue, tag, no_ack = channel.delivery
        channel.delivery = None
        if no_ack:
            self.gateway.removed(self.vhost, queue, 1, size)
        else:
            channel.deliveries.delivered(tag, queue, size)

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
            self._send_client(number, _confirm_frame(number, confirm))
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
        self._update_reading()

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


class _Upstream(asyncio.Protocol):
    """The protocol of a relay's upstream socket: hands everything to the relay."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._relay._upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._relay._upstream_chunk(data)

    def eof_received(self) -> bool | None:
        self._relay.abort()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._relay._side_lost("upstream")

    def pause_writing(self) -> None:
        self._relay._pause_client("upstream")

    def resume_writing(self) -> None:
        self._relay._resume_client("upstream")
