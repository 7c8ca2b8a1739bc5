"""A TCP proxy that cuts AMQP connections at chosen frames (fault injection).

``FaultProxy(upstream, plan)`` relays connections to RabbitMQ; the i-th
connection it accepts follows ``plan[i]`` (no cut when the plan is shorter
or the entry is None):

* ``Cut.after_publishes(n)``: forward ``n`` Basic.Publish frames, then cut
  the connection at the next one (``n = 0``: at the first publish);
* ``Cut.inside_a_batch_after(n)``: the same, at the first publish after
  ``n`` that is not the first of the bytes read at once (so inside a batch);
* ``Cut.at_channel_open(k)``: cut at the k-th Channel.Open;
* ``Cut.drop_confirms()``: never cut, but swallow every Basic.Ack the broker
  sends (publisher confirms that never come).

A cut closes both sockets before the frame is forwarded, so the broker
never sees it.  ``cut_all()`` cuts every live connection at once.  The
proxy counts what crossed each connection (publishes up, deliveries down).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

_PUBLISH = (60, 40)
_DELIVER = (60, 60)
_CHANNEL_OPEN = (20, 10)
_ACK = (60, 80)
_METHOD_FRAME = 1


@dataclass(frozen=True)
class Cut:
    """Where to cut one connection."""

    method: tuple[int, int]
    nth: int  # cut at the nth such frame (1-based); 0: drop every such frame from the broker
    inside_batch: bool = False  # ... or the first one after it preceded by a publish in its read

    @classmethod
    def after_publishes(cls, n: int) -> Cut:
        return cls(_PUBLISH, n + 1)

    @classmethod
    def inside_a_batch_after(cls, n: int) -> Cut:
        """Cut at the first publish after ``n`` that came in the same read as
        an earlier publish: inside a batch the client wrote at once."""
        return cls(_PUBLISH, n + 1, inside_batch=True)

    @classmethod
    def at_channel_open(cls, k: int) -> Cut:
        return cls(_CHANNEL_OPEN, k)

    @classmethod
    def drop_confirms(cls) -> Cut:
        return cls(_ACK, 0)


@dataclass
class ConnectionRecord:
    """What crossed one proxied connection."""

    index: int
    publishes: int = 0
    channel_opens: int = 0
    deliveries: int = 0
    cut: bool = False
    cut_mid_chunk: bool = False  # publishes preceded the cut frame in the same read
    dropped: int = 0
    sockets: list[socket.socket] = field(default_factory=list)


class _Frames:
    """Splits a byte stream into AMQP frames (after the 8-byte protocol header
    when ``header``).  ``feed`` returns, per complete method frame, where it
    starts in the chunk just fed (negative: it began in an earlier chunk,
    already relayed) and its (class, method) ids."""

    def __init__(self, header: bool) -> None:
        self._buffer = b""
        self._skip = 8 if header else 0

    def feed(self, data: bytes) -> list[tuple[int, tuple[int, int]]]:
        base = len(self._buffer)  # where ``data`` starts in the buffer
        self._buffer += data
        out: list[tuple[int, tuple[int, int]]] = []
        pos = 0
        if self._skip:
            if len(self._buffer) < self._skip:
                return out
            pos, self._skip = self._skip, 0
        while len(self._buffer) - pos >= 7:
            kind, _channel, size = struct.unpack_from(">BHI", self._buffer, pos)
            end = pos + 7 + size + 1
            if len(self._buffer) < end:
                break
            if kind == _METHOD_FRAME and size >= 4:
                out.append((pos - base, struct.unpack_from(">HH", self._buffer, pos + 7)))
            pos = end
        self._buffer = self._buffer[pos:]
        return out


class FaultProxy:
    """Relays 127.0.0.1:<port> to ``upstream``, cutting connections per ``plan``."""

    def __init__(self, upstream: tuple[str, int], plan: Sequence[Cut | None] | None = None) -> None:
        self._upstream = upstream
        self._plan = list(plan or [])
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self.connections: list[ConnectionRecord] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def url(self, vhost: str = "%2F") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    @property
    def cuts(self) -> int:
        with self._lock:
            return sum(1 for c in self.connections if c.cut)

    def cut_all(self) -> None:
        """Cut every live connection now."""
        with self._lock:
            records = list(self.connections)
        for record in records:
            self._cut(record)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _cut(self, record: ConnectionRecord, *, planned: bool = True) -> None:
        with self._lock:
            if planned and record.sockets and not record.cut:
                record.cut = True
            sockets = list(record.sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                record = ConnectionRecord(len(self.connections), sockets=[client, upstream])
                self.connections.append(record)
                cut = self._plan[record.index] if record.index < len(self._plan) else None
            up_cut = cut if cut is not None and cut.nth > 0 else None
            threading.Thread(
                target=self._up, args=(record, client, upstream, up_cut), daemon=True
            ).start()
            down = self._drop_down if cut is not None and cut.nth == 0 else self._down
            threading.Thread(target=down, args=(record, upstream, client), daemon=True).start()

    def _up(
        self, record: ConnectionRecord, source: socket.socket, sink: socket.socket, cut: Cut | None
    ) -> None:
        frames = _Frames(header=True)
        seen: dict[tuple[int, int], int] = {}
        try:
            while data := source.recv(65536):
                frames_in_chunk = frames.feed(data)
                for start, method in frames_in_chunk:
                    seen[method] = seen.get(method, 0) + 1
                    if self._cut_here(cut, method, seen, start, frames_in_chunk):
                        # Relay what came before this frame, then cut: the
                        # broker never sees the frame.
                        if start > 0:
                            sink.sendall(data[:start])
                        with self._lock:
                            record.cut_mid_chunk = any(
                                m == _PUBLISH and 0 <= st < start for st, m in frames_in_chunk
                            )
                        self._cut(record)
                        return
                    with self._lock:
                        if method == _PUBLISH:
                            record.publishes += 1
                        elif method == _CHANNEL_OPEN:
                            record.channel_opens += 1
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(record, planned=False)

    def _down(self, record: ConnectionRecord, source: socket.socket, sink: socket.socket) -> None:
        frames = _Frames(header=False)
        try:
            while data := source.recv(65536):
                deliveries = sum(1 for _start, method in frames.feed(data) if method == _DELIVER)
                if deliveries:
                    with self._lock:
                        record.deliveries += deliveries
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(record, planned=False)

    @staticmethod
    def _cut_here(
        cut: Cut | None,
        method: tuple[int, int],
        seen: dict[tuple[int, int], int],
        start: int,
        chunk: list[tuple[int, tuple[int, int]]],
    ) -> bool:
        if cut is None or method != cut.method:
            return False
        if not cut.inside_batch:
            return seen[method] == cut.nth
        return seen[method] >= cut.nth and any(m == _PUBLISH and 0 <= st < start for st, m in chunk)

    def _drop_down(
        self, record: ConnectionRecord, source: socket.socket, sink: socket.socket
    ) -> None:
        """Relay broker -> client whole frames, leaving out every Basic.Ack."""
        buffer = b""
        try:
            while data := source.recv(65536):
                buffer += data
                out: list[bytes] = []
                pos = 0
                while len(buffer) - pos >= 7:
                    kind, _channel, size = struct.unpack_from(">BHI", buffer, pos)
                    end = pos + 7 + size + 1
                    if len(buffer) < end:
                        break
                    method = (
                        struct.unpack_from(">HH", buffer, pos + 7)
                        if kind == _METHOD_FRAME and size >= 4
                        else None
                    )
                    if method == _ACK:
                        with self._lock:
                            record.dropped += 1
                    else:
                        out.append(buffer[pos:end])
                    pos = end
                buffer = buffer[pos:]
                if out:
                    sink.sendall(b"".join(out))
        except OSError:
            pass
        finally:
            self._cut(record, planned=False)
