"""The cluster's control bus: one AMQP connection of a member to RabbitMQ (asyncio).

Everything the members say to each other goes through RabbitMQ, under
``rabbitflow.cluster.NAME`` in the ``/`` virtual host:

* the exchange ``rabbitflow.cluster.NAME`` (direct): each member's own
  queue ``rabbitflow.cluster.NAME.member.ID`` (exclusive: it goes with the
  member's connection) is bound with the member's id and with ``all``;
* the quorum queue ``rabbitflow.cluster.NAME.owner`` with
  ``x-single-active-consumer``: every member consumes it and RabbitMQ
  delivers to one at a time.  The member that receives from it is the
  *owner*; when its connection ends, RabbitMQ hands the queue to another.
  Every member publishes its heartbeat there (and requests, while it does
  not know the owner yet), so the active consumer learns at once that it
  is the owner.  Messages in it expire after one lease.
* the quorum queue ``rabbitflow.cluster.NAME.epochs``, which nobody
  consumes: each new owner leaves one message in it per epoch it takes, so
  the count of its messages is at least the highest epoch ever taken.  The
  bus reads that count (the declare's answer) before it consumes the owner
  queue and hands it to its member as ``{"t": "epoch", "e": count}``: an
  owner's epoch is above every one taken before, even when it owns before
  it has heard from any other member.

Messages are JSON objects (``{"t": type, ...}``).  The owner's state names
every queue, so a body may be larger than the frame_max agreed with
RabbitMQ: it is sent, and read back, in several body frames.  The connection
negotiates AMQP heartbeats of a quarter lease, so RabbitMQ ends the
connection of a member that stops answering (``SIGSTOP``, a cut cable)
after about half a lease and moves the owner queue on; and the member, by
AMQP's rule with a margin, takes the connection for lost when nothing (no
frame, no heartbeat) came from RabbitMQ for four heartbeat intervals, so an
owner cut off without a word steps down instead of granting on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from pamqp import commands, frame, heartbeat
from pamqp.base import Frame

from rabbitflow_broker.engine.errors import OutsideError
from rabbitflow_broker.server.amqp_open import FRAME_MAX, open_connection, read_method

__all__ = ["BusError", "ControlBus"]

_log = structlog.get_logger("rabbitflow.broker")
_FRAME_END = 0xCE
_END_BYTE = bytes([_FRAME_END])
_METHOD, _HEADER, _BODY = 1, 2, 3
_FRAME_HEAD = struct.Struct(">BHI")
#: A content header frame with no properties: kind, channel, size, class,
#: weight, body size, property flags, frame end.
_HEADER_FRAME = struct.Struct(">BHIHHQHB")
#: Bytes of a frame besides its payload: the head (kind, channel, size) and the end.
_FRAME_OVERHEAD = _FRAME_HEAD.size + 1
_METHOD_ID = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_BASIC_DELIVER = (60 << 16) | 60
_CONNECTION_CLOSE = (10 << 16) | 50
_CHANNEL_CLOSE = (20 << 16) | 40
_CHANNEL = 1
#: Heartbeat intervals without a frame from RabbitMQ after which the bus is lost:
#: AMQP says two, but RabbitMQ may leave up to two between its heartbeats, and a
#: busy loop reads late; a false alarm moves the owner, so leave a margin.
_SILENT_BEATS = 4
_OWNER_TAG = "owner"
_MEMBER_TAG = "member"
_F = TypeVar("_F", bound=Frame)


def _content_frames(body: bytes, frame_max: int) -> bytes:
    """The content header (no properties) and body frames of ``body`` on the
    bus channel, each body frame at most ``frame_max`` bytes in all:
    RabbitMQ ends the connection (501 FRAME_ERROR) on a larger one."""
    frames: list[bytes | memoryview] = [
        _HEADER_FRAME.pack(_HEADER, _CHANNEL, 14, 60, 0, len(body), 0, _FRAME_END)
    ]
    step = frame_max - _FRAME_OVERHEAD
    view = memoryview(body)
    for start in range(0, len(body), step):
        chunk = view[start : start + step]
        frames += (_FRAME_HEAD.pack(_BODY, _CHANNEL, len(chunk)), chunk, _END_BYTE)
    return b"".join(frames)


class BusError(OutsideError):
    """The control bus connection failed or RabbitMQ refused it."""


class ControlBus:
    """One member's connection to the control bus.

    ``on_message(message, to_owner)`` is called for every message received,
    with ``to_owner`` True for those taken from the owner queue (which makes
    this member the owner).  ``on_lost()`` is called once when an open
    connection ends.
    """

    def __init__(
        self,
        *,
        cluster: str,
        member: str,
        nodes: list[tuple[str, int]],
        user: str,
        password: str,
        lease: float,
        on_message: Callable[[dict[str, Any], bool], None],
        on_lost: Callable[[], None],
        connect_timeout: float = 5.0,
    ) -> None:
        self.cluster = cluster
        self.member = member
        self.exchange = f"rabbitflow.cluster.{cluster}"
        self.owner_queue = f"{self.exchange}.owner"
        self.epochs_queue = f"{self.exchange}.epochs"
        self.member_queue = f"{self.exchange}.member.{member}"
        # The nodes of the RabbitMQ cluster: a failed connection tries the next.
        self._nodes = list(nodes)
        self._credentials = (user, password)
        self._lease = lease
        self._on_message = on_message
        self._on_lost = on_lost
        self._timeout = connect_timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._publish_frames: dict[str, bytes] = {}
        #: The largest frame RabbitMQ takes on this connection (agreed in Tune-Ok).
        self._frame_max = FRAME_MAX
        # The delivery being read: its consumer tag, body size and body so far.
        self._tag = ""
        self._size = 0
        self._chunks: list[bytes] = []
        #: Messages sent and received (control traffic, for the admin API and benches).
        self.sent = 0
        self.received = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    # -- connection --------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection, declare the topology and start consuming.

        Raises:
            BusError: RabbitMQ is unreachable or refused something.
        """
        try:
            await asyncio.wait_for(self._connect(), self._timeout)
        except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError) as exc:
            host, port = self._nodes[0]
            self._nodes.append(self._nodes.pop(0))  # next time, the next node
            self._drop()
            raise BusError(f"cluster bus at {host}:{port}: {exc!r}") from exc
        except BusError:
            self._drop()
            raise
        beat = max(1, round(self._lease / 4))
        self._tasks = [
            asyncio.create_task(self._read_loop(_SILENT_BEATS * beat), name="cluster-bus-read"),
            asyncio.create_task(self._heartbeat_loop(beat), name="cluster-bus-heartbeat"),
        ]

    async def _connect(self) -> None:
        host, port = self._nodes[0]
        user, password = self._credentials
        self._reader, self._writer, self._frame_max = await open_connection(
            host,
            port,
            user=user,
            password=password,
            vhost="/",
            name=f"rabbitflow cluster {self.cluster} member {self.member}",
            error=BusError,
            what="the cluster bus",
            heartbeat=max(1, round(self._lease / 4)),
        )
        await self._declare_topology(self._writer)

    async def _declare_topology(self, writer: asyncio.StreamWriter) -> None:
        """The exchange, the owner queue and this member's queue; the epochs
        taken (see the module docstring); consume both queues."""
        writer.write(frame.marshal(commands.Channel.Open(), _CHANNEL))
        await self._expect(_CHANNEL, commands.Channel.OpenOk, "a channel")
        writer.write(
            frame.marshal(
                commands.Exchange.Declare(exchange=self.exchange, exchange_type="direct"),
                _CHANNEL,
            )
        )
        await self._expect(_CHANNEL, commands.Exchange.DeclareOk, self.exchange)
        writer.write(
            frame.marshal(
                commands.Queue.Declare(
                    queue=self.owner_queue,
                    durable=True,
                    arguments={
                        "x-queue-type": "quorum",
                        "x-single-active-consumer": True,
                        "x-message-ttl": max(1, int(self._lease * 1000)),
                    },
                ),
                _CHANNEL,
            )
        )
        await self._expect(_CHANNEL, commands.Queue.DeclareOk, self.owner_queue)
        writer.write(
            frame.marshal(
                commands.Queue.Declare(queue=self.member_queue, exclusive=True, auto_delete=True),
                _CHANNEL,
            )
        )
        await self._expect(_CHANNEL, commands.Queue.DeclareOk, self.member_queue)
        for key in (self.member, "all"):
            writer.write(
                frame.marshal(
                    commands.Queue.Bind(
                        queue=self.member_queue, exchange=self.exchange, routing_key=key
                    ),
                    _CHANNEL,
                )
            )
            await self._expect(_CHANNEL, commands.Queue.BindOk, f"binding {key}")
        # After the bindings: an epoch taken after the count is read reaches
        # this member in its owner's state.  Before consuming: nothing makes
        # this member the owner before it knows the count.
        await self._read_epochs(writer)
        for queue, tag in ((self.member_queue, _MEMBER_TAG), (self.owner_queue, _OWNER_TAG)):
            writer.write(
                frame.marshal(
                    commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=True), _CHANNEL
                )
            )
            await self._expect(_CHANNEL, commands.Basic.ConsumeOk, f"consuming {queue}")

    async def _expect(self, channel: int, kind: type[_F], what: str) -> _F:
        reply = await self._method(channel)
        if not isinstance(reply, kind):
            raise BusError(f"RabbitMQ refused {what}: {reply!r}")
        return reply

    async def _read_epochs(self, writer: asyncio.StreamWriter) -> None:
        """Declare the epochs queue and tell the member how many epochs were taken."""
        declare = commands.Queue.Declare(
            queue=self.epochs_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        writer.write(frame.marshal(declare, _CHANNEL))
        declared = await self._expect(_CHANNEL, commands.Queue.DeclareOk, self.epochs_queue)
        self._on_message({"t": "epoch", "e": declared.message_count}, False)

    async def _method(self, channel: int) -> Frame:
        reader = self._reader
        assert reader is not None
        value = await read_method(reader, channel, BusError, "the cluster bus")
        if isinstance(value, commands.Channel.Close):
            raise BusError(
                f"RabbitMQ closed the bus channel: {value.reply_code} {value.reply_text}"
            )
        return value

    async def _read_loop(self, silence: float) -> None:
        """Read until the connection ends, or nothing came for ``silence`` seconds."""
        reader = self._reader
        assert reader is not None
        buffer = bytearray()
        try:
            while True:
                try:
                    async with asyncio.timeout(silence):  # no task per read, as wait_for makes
                        data = await reader.read(65536)
                except TimeoutError:
                    raise EOFError(f"nothing from RabbitMQ for {silence:g} s") from None
                if not data:
                    raise EOFError("RabbitMQ closed the connection")
                buffer += data
                del buffer[: self._frames(buffer)]
        except asyncio.CancelledError:
            raise
        except (OSError, EOFError, BusError) as exc:
            _log.warning("cluster bus lost", cluster=self.cluster, error=str(exc) or repr(exc))
        self._drop()
        self._on_lost()

    def _frames(self, buffer: bytearray) -> int:
        """Handle the whole frames at the start of ``buffer``; returns their length.

        Only what the bus receives is decoded: Basic.Deliver (its consumer
        tag), content headers (the body size), bodies, heartbeats, and a
        connection or channel close.
        """
        pos = 0
        size_all = len(buffer)
        while size_all - pos >= 8:
            kind, _channel, size = _FRAME_HEAD.unpack_from(buffer, pos)
            end = pos + 7 + size
            if end >= size_all:
                break
            if buffer[end] != _FRAME_END:
                raise BusError("malformed frame from RabbitMQ")
            payload = pos + 7
            if kind == _METHOD:
                method = _METHOD_ID.unpack_from(buffer, payload)[0]
                if method == _BASIC_DELIVER:
                    length = buffer[payload + 4]
                    self._tag = bytes(buffer[payload + 5 : payload + 5 + length]).decode()
                    self._chunks = []
                elif method in (_CONNECTION_CLOSE, _CHANNEL_CLOSE):
                    code = _U16.unpack_from(buffer, payload + 4)[0]
                    length = buffer[payload + 6]
                    text = bytes(buffer[payload + 7 : payload + 7 + length]).decode(
                        errors="replace"
                    )
                    raise BusError(f"RabbitMQ closed the cluster bus: {code} {text}")
            elif kind == _HEADER:
                self._size = _U64.unpack_from(buffer, payload + 4)[0]
                if self._size == 0:
                    self._deliver(self._tag, b"")
            elif kind == _BODY:
                self._chunks.append(bytes(buffer[payload:end]))
                if sum(map(len, self._chunks)) >= self._size:
                    data, self._chunks = b"".join(self._chunks), []
                    self._deliver(self._tag, data)
            pos = end + 1
        return pos

    def _deliver(self, tag: str, data: bytes) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            _log.warning("cluster bus message ignored: not JSON", size=len(data))
            return
        if not isinstance(message, dict):
            return
        self.received += 1
        self._on_message(message, tag == _OWNER_TAG)

    async def _heartbeat_loop(self, beat: int) -> None:
        beat_frame = frame.marshal(heartbeat.Heartbeat(), 0)
        while self._writer is not None:
            await asyncio.sleep(beat)
            writer = self._writer
            if writer is not None:
                try:
                    writer.write(beat_frame)
                except (OSError, RuntimeError):
                    writer.close()  # the read loop ends and reports the bus lost

    # -- sending -----------------------------------------------------------------

    def send(self, message: dict[str, Any], *, to: str) -> bool:
        """Publish ``message`` to a member's id, ``all``, or (``to="owner"``,
        ``"epochs"``) that queue; False when the bus is down (nothing is queued)."""
        writer = self._writer
        if writer is None:
            return False
        data = json.dumps(message, separators=(",", ":")).encode()
        publish = self._publish_frames.get(to)
        if publish is None:
            if to in ("owner", "epochs"):
                queue = self.owner_queue if to == "owner" else self.epochs_queue
                method = commands.Basic.Publish(exchange="", routing_key=queue)
            else:
                method = commands.Basic.Publish(exchange=self.exchange, routing_key=to)
            publish = self._publish_frames[to] = frame.marshal(method, _CHANNEL)
        try:
            writer.write(publish + _content_frames(data, self._frame_max))
        except (OSError, RuntimeError):
            return False
        self.sent += 1
        return True

    async def close(self) -> None:
        """Leave the bus (RabbitMQ then moves the owner queue to another member)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        writer = self._writer
        if writer is None:
            return
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(frame.marshal(commands.Connection.Close(200, "member leaving", 0, 0), 0))
        self._drop()
        with contextlib.suppress(OSError, RuntimeError, asyncio.CancelledError):
            await writer.wait_closed()

    def _drop(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
