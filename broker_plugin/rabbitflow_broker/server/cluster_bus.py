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
* the quorum queue ``rabbitflow.cluster.NAME.epochs``, nobody consumes:
  the epochs record, the last epoch an owner took.  It keeps one message
  (``x-max-length`` 1, ``x-overflow`` drop-head: a new record takes the
  place of the last).  A member handed the owner queue reads it
  (:meth:`ControlBus.read_epochs`: a Basic.Get, the message put back at
  once) and records its own epoch (:meth:`ControlBus.record_epoch`: a
  publish that RabbitMQ confirms) before it acts as owner, on a channel of
  their own with publisher confirms.  A record that gets no answer within
  ``record_timeout`` ends the connection: an owner never goes on from a
  record it could not read (see
  :mod:`~rabbitflow_broker.engine.cluster_claim`).

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
from pamqp import commands, exceptions, frame, heartbeat
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

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
_BASIC_CONSUME_OK = (60 << 16) | 21
_CONNECTION_CLOSE = (10 << 16) | 50
_CHANNEL_CLOSE = (20 << 16) | 40
_CHANNEL = 1
#: The channel of the epochs record: publisher confirms on, nothing else on it.
_RECORD = 2
#: Heartbeat intervals without a frame from RabbitMQ after which the bus is lost:
#: AMQP says two, but RabbitMQ may leave up to two between its heartbeats, and a
#: busy loop reads late; a false alarm moves the owner, so leave a margin.
_SILENT_BEATS = 4
_OWNER_TAG = "owner"
_MEMBER_TAG = "member"
_F = TypeVar("_F", bound=Frame)


def _content_frames(body: bytes, frame_max: int, channel: int = _CHANNEL) -> bytes:
    """The content header (no properties) and body frames of ``body`` on
    ``channel``, each body frame at most ``frame_max`` bytes in all:
    RabbitMQ ends the connection (501 FRAME_ERROR) on a larger one."""
    frames: list[bytes | memoryview] = [
        _HEADER_FRAME.pack(_HEADER, channel, 14, 60, 0, len(body), 0, _FRAME_END)
    ]
    step = frame_max - _FRAME_OVERHEAD
    view = memoryview(body)
    for start in range(0, len(body), step):
        chunk = view[start : start + step]
        frames += (_FRAME_HEAD.pack(_BODY, channel, len(chunk)), chunk, _END_BYTE)
    return b"".join(frames)


def _record_epoch(data: bytes) -> int:
    """The epoch a record holds.  One that cannot be read (not written by a
    member) still says that some epoch was taken: 1."""
    try:
        message = json.loads(data)
        return max(1, int(message["e"]))
    except (ValueError, TypeError, KeyError):
        _log.warning("cluster epochs record unreadable: taken as epoch 1", size=len(data))
        return 1


def _no_record(kind: str, epoch: int | None) -> None:
    pass


class BusError(OutsideError):
    """The control bus connection failed or RabbitMQ refused it."""


class ControlBus:
    """One member's connection to the control bus.

    ``on_message(message, to_owner)`` is called for every message received,
    with ``to_owner`` True for those taken from the owner queue (which makes
    this member the owner).  ``on_lost()`` is called once when an open
    connection ends (or one that failed as it opened, after it handed
    something over).  ``on_record(kind, epoch)`` gets the epochs record's
    answers: ``("read", epoch)`` (None: the record is empty, RabbitMQ says)
    and ``("recorded", epoch)`` (RabbitMQ confirmed it).
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
        on_record: Callable[[str, int | None], None] = _no_record,
        connect_timeout: float = 5.0,
        record_timeout: float | None = None,
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
        self._on_record = on_record
        self._timeout = connect_timeout
        #: Seconds the epochs record may take to answer before the connection is ended.
        self._record_timeout = max(5.0, 2 * lease) if record_timeout is None else record_timeout
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
        #: Consume-Oks still awaited as the bus connects, and what came after them.
        self._consuming = 0
        self._pending = bytearray()
        #: Whether anything was handed to the member on this connection.
        self._handed = False
        # The epochs record: a read under way (its deadline), the record
        # message being read (its delivery tag, body size, body so far), and
        # the records not confirmed yet (publish number -> epoch, deadline).
        self._reading: asyncio.TimerHandle | None = None
        self._got = 0
        self._got_size = 0
        self._got_chunks: list[bytes] = []
        self._published = 0
        self._confirms: dict[int, tuple[int, asyncio.TimerHandle]] = {}
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
        self._handed = False
        try:
            await asyncio.wait_for(self._connect(), self._timeout)
        except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError, BusError) as exc:
            self._drop()
            if self._handed:  # the member heard something of it: it is lost now
                self._on_lost()
            if isinstance(exc, BusError):
                raise
            host, port = self._nodes[0]
            self._nodes.append(self._nodes.pop(0))  # next time, the next node
            raise BusError(f"cluster bus at {host}:{port}: {exc!r}") from exc
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
        await self._declare_topology()
        await self._call(commands.Channel.Open(), commands.Channel.OpenOk, "a channel", _RECORD)
        await self._call(
            commands.Confirm.Select(), commands.Confirm.SelectOk, "publisher confirms", _RECORD
        )
        await self._consume()

    async def _declare_topology(self) -> None:
        """The exchange, the owner queue, this member's queue, the epochs record."""
        await self._call(commands.Channel.Open(), commands.Channel.OpenOk, "a channel")
        exchange = commands.Exchange.Declare(exchange=self.exchange, exchange_type="direct")
        await self._call(exchange, commands.Exchange.DeclareOk, self.exchange)
        owner = commands.Queue.Declare(
            queue=self.owner_queue,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-single-active-consumer": True,
                "x-message-ttl": max(1, int(self._lease * 1000)),
            },
        )
        await self._call(owner, commands.Queue.DeclareOk, self.owner_queue)
        member = commands.Queue.Declare(queue=self.member_queue, exclusive=True, auto_delete=True)
        await self._call(member, commands.Queue.DeclareOk, self.member_queue)
        for key in (self.member, "all"):
            bind = commands.Queue.Bind(
                queue=self.member_queue, exchange=self.exchange, routing_key=key
            )
            await self._call(bind, commands.Queue.BindOk, f"binding {key}")
        epochs = commands.Queue.Declare(  # a durable quorum queue that keeps the last message
            queue=self.epochs_queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "drop-head"},
        )
        await self._call(epochs, commands.Queue.DeclareOk, self.epochs_queue)

    async def _consume(self) -> None:
        """Consume this member's queue and the owner queue.  Deliveries may
        come before both Consume-Oks (what waits in the member queue comes
        right after its own): everything is handled as it comes, as the read
        loop does, and what follows the last Consume-Ok is left to it."""
        writer, reader = self._writer, self._reader
        assert writer is not None
        assert reader is not None
        self._consuming = 2
        for queue, tag in ((self.member_queue, _MEMBER_TAG), (self.owner_queue, _OWNER_TAG)):
            consume = commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=True)
            writer.write(frame.marshal(consume, _CHANNEL))
        buffer = self._pending = bytearray()
        while self._consuming > 0:
            data = await reader.read(65536)
            if not data:
                raise EOFError("RabbitMQ closed the connection")
            buffer += data
            del buffer[: self._frames(buffer)]

    async def _call(self, method: Frame, kind: type[_F], what: str, channel: int = _CHANNEL) -> _F:
        """Send ``method`` on ``channel`` and read its answer, of ``kind``."""
        writer = self._writer
        assert writer is not None
        writer.write(frame.marshal(method, channel))
        return await self._expect(channel, kind, what)

    async def _expect(self, channel: int, kind: type[_F], what: str) -> _F:
        reply = await self._method(channel)
        if not isinstance(reply, kind):
            raise BusError(f"RabbitMQ refused {what}: {reply!r}")
        return reply

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
        buffer, self._pending = self._pending, bytearray()
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
        tag), content headers (the body size), bodies, heartbeats, a
        Consume-Ok, a connection or channel close, and whatever comes on the
        record channel (:meth:`_record_frame`).
        """
        pos = 0
        size_all = len(buffer)
        while size_all - pos >= 8:
            kind, channel, size = _FRAME_HEAD.unpack_from(buffer, pos)
            end = pos + 7 + size
            if end >= size_all:
                break
            if buffer[end] != _FRAME_END:
                raise BusError("malformed frame from RabbitMQ")
            payload = pos + 7
            if channel == _RECORD:
                self._record_frame(bytes(buffer[pos : end + 1]))
            elif kind == _METHOD:
                self._method_frame(buffer, payload)
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

    def _method_frame(self, buffer: bytearray, payload: int) -> None:
        method = _METHOD_ID.unpack_from(buffer, payload)[0]
        if method == _BASIC_DELIVER:
            length = buffer[payload + 4]
            self._tag = bytes(buffer[payload + 5 : payload + 5 + length]).decode()
            self._chunks = []
        elif method == _BASIC_CONSUME_OK:
            self._consuming -= 1
        elif method in (_CONNECTION_CLOSE, _CHANNEL_CLOSE):
            code = _U16.unpack_from(buffer, payload + 4)[0]
            length = buffer[payload + 6]
            text = bytes(buffer[payload + 7 : payload + 7 + length]).decode(errors="replace")
            raise BusError(f"RabbitMQ closed the cluster bus: {code} {text}")

    def _deliver(self, tag: str, data: bytes) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            _log.warning("cluster bus message ignored: not JSON", size=len(data))
            return
        if not isinstance(message, dict):
            return
        self.received += 1
        self._handed = True
        self._on_message(message, tag == _OWNER_TAG)

    # -- the epochs record -------------------------------------------------------

    def read_epochs(self) -> bool:
        """Ask for the epochs record (a Basic.Get, its message put back at
        once): the answer goes to ``on_record("read", epoch)``, None when
        RabbitMQ says it is empty.  False when the bus is down."""
        writer = self._writer
        if writer is None:
            return False
        if self._reading is None:  # else the answer under way serves
            try:
                writer.write(frame.marshal(commands.Basic.Get(queue=self.epochs_queue), _RECORD))
            except (OSError, RuntimeError):
                return False
            self._reading = self._deadline("reading the epochs record")
        return True

    def record_epoch(self, epoch: int) -> bool:
        """Record ``epoch`` in place of the last one: ``on_record("recorded",
        epoch)`` once RabbitMQ confirmed it.  False when the bus is down."""
        writer = self._writer
        if writer is None:
            return False
        data = json.dumps({"t": "epoch", "e": epoch, "m": self.member}).encode()
        publish = commands.Basic.Publish(exchange="", routing_key=self.epochs_queue)
        try:
            writer.write(
                frame.marshal(publish, _RECORD) + _content_frames(data, self._frame_max, _RECORD)
            )
        except (OSError, RuntimeError):
            return False
        self._published += 1
        self._confirms[self._published] = (epoch, self._deadline(f"recording epoch {epoch}"))
        return True

    def _deadline(self, what: str) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(self._record_timeout, self._no_answer, what)

    def _no_answer(self, what: str) -> None:
        """The epochs record did not answer in time (its queue has no leader,
        a node is failing): end the connection, as for a lost one."""
        _log.warning(
            "cluster bus: no answer from the epochs record",
            cluster=self.cluster,
            what=what,
            after_s=self._record_timeout,
        )
        writer = self._writer
        if writer is not None:
            writer.close()  # the read loop ends and reports the bus lost

    def _record_frame(self, data: bytes) -> None:
        """A frame on the record channel: an answer to :meth:`read_epochs`
        or :meth:`record_epoch` (rare: decoded in full)."""
        try:
            value = frame.unmarshal(data)[2]
        except exceptions.UnmarshalingException as exc:
            raise BusError(f"malformed frame from RabbitMQ: {exc}") from None
        if isinstance(value, commands.Basic.GetOk):
            self._got, self._got_size, self._got_chunks = value.delivery_tag or 0, -1, []
        elif isinstance(value, ContentHeader):
            self._got_size = value.body_size or 0
        elif isinstance(value, ContentBody):
            self._got_chunks.append(value.value)
        elif isinstance(value, commands.Basic.GetEmpty):
            self._answered("read", None)
        elif isinstance(value, commands.Basic.Ack):
            self._confirmed(value.delivery_tag, value.multiple)
        elif isinstance(value, commands.Basic.Nack):
            raise BusError("RabbitMQ refused to record an epoch (basic.nack)")
        elif isinstance(value, commands.Channel.Close):
            raise BusError(
                f"RabbitMQ closed the epochs record: {value.reply_code} {value.reply_text}"
            )
        if self._got and sum(map(len, self._got_chunks)) >= self._got_size >= 0:
            self._read_record()

    def _read_record(self) -> None:
        """The record's message is in: put it back at once (left for the
        next owner), and hand over its epoch."""
        tag, data = self._got, b"".join(self._got_chunks)
        self._got, self._got_chunks = 0, []
        writer = self._writer
        if writer is not None:
            writer.write(frame.marshal(commands.Basic.Reject(tag, requeue=True), _RECORD))
        self._answered("read", _record_epoch(data))

    def _answered(self, kind: str, epoch: int | None) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        self._handed = True
        self._on_record(kind, epoch)

    def _confirmed(self, tag: int, multiple: bool) -> None:
        for number in sorted(self._confirms):
            if number == tag or (multiple and number < tag):
                epoch, deadline = self._confirms.pop(number)
                deadline.cancel()
                self._handed = True
                self._on_record("recorded", epoch)

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
        """Publish ``message`` to a member's id, ``all``, or (``to="owner"``)
        the owner queue; False when the bus is down (nothing is queued)."""
        writer = self._writer
        if writer is None:
            return False
        data = json.dumps(message, separators=(",", ":")).encode()
        publish = self._publish_frames.get(to)
        if publish is None:
            if to == "owner":
                method = commands.Basic.Publish(exchange="", routing_key=self.owner_queue)
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
        # Answers of the epochs record never come on another connection.
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        for _, deadline in self._confirms.values():
            deadline.cancel()
        self._confirms.clear()
        self._published = self._got = 0
        self._got_chunks = []
        self._pending = bytearray()
