"""Current ready counts of a few queues, by passive ``queue.declare`` (asyncio).

The gateway's own AMQP connection to RabbitMQ, one per virtual host, used
only to ask RabbitMQ how many messages are ready in the queues that are
flowed or near their thresholds.  A passive declare is answered by the
queue itself (a quorum queue's leader), so the count is current, unlike
the management API's statistics.  The declares of one poll go out in one
write and come back in order; a queue that is gone closes the channel
(404), which is reopened for the rest.

:class:`PassiveDeclarer` is the I/O and :class:`DepthPoll` one round over
the gateway's hot queues; what the counts mean (and when they may be
adopted) is decided by :class:`~rabbitflow_broker.hub.depth_sources.DepthSources`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from pamqp import commands, frame
from pamqp.base import Frame

from rabbitflow_broker.engine.errors import OutsideError
from rabbitflow_broker.hub.depth_sources import DepthSources
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.amqp_open import open_connection, read_method

__all__ = ["DeclareError", "Declared", "DepthPoll", "PassiveDeclarer"]

_log = structlog.get_logger("rabbitflow.broker")

_NOT_FOUND = 404


class DeclareError(OutsideError):
    """The connection for passive declares failed (it is reopened on next use)."""


@dataclass(frozen=True, slots=True)
class Declared:
    """One passive declare's answer: ``ready`` messages and ``consumers``,
    or ``missing`` when RabbitMQ has no such queue; ``elapsed`` is the
    seconds from sending the poll's declares to this answer."""

    queue: str
    ready: int
    consumers: int
    missing: bool
    elapsed: float


class PassiveDeclarer:
    """An AMQP connection to one vhost that answers passive declares.

    Opened on first use, reopened after a failure; ``timeout`` bounds each
    exchange with RabbitMQ.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        more: Sequence[tuple[str, int]] = (),
        user: str,
        password: str,
        vhost: str,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        # The other nodes of a RabbitMQ cluster: a failed connection moves on.
        self._addresses = [(host, port), *more]
        self._credentials = (user, password)
        self.vhost = vhost
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._channel = 0
        self._lock = asyncio.Lock()

    async def declare(self, queues: Sequence[str]) -> list[Declared]:
        """Passively declare ``queues``; one answer each, in order.

        Raises:
            DeclareError: RabbitMQ could not be reached or broke the
                exchange (the connection is dropped and reopened next time).
        """
        async with self._lock:
            try:
                return await asyncio.wait_for(self._declare_all(list(queues)), self._timeout)
            except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError) as exc:
                self._drop()
                raise DeclareError(f"passive declare in vhost {self.vhost!r}: {exc!r}") from exc
            except DeclareError:
                self._drop()
                raise

    async def close(self) -> None:
        """Close the connection (politely when it is open)."""
        writer = self._writer
        if writer is None:
            return
        try:
            goodbye = commands.Connection.Close(200, "gateway depth poll", 0, 0)
            writer.write(frame.marshal(goodbye, 0))
        except (OSError, RuntimeError):
            pass  # already broken: closing the socket is all there is to do
        finally:
            self._drop()
        with contextlib.suppress(OSError, RuntimeError, asyncio.CancelledError):
            await writer.wait_closed()

    # -- the exchange ------------------------------------------------------------

    async def _declare_all(self, queues: list[str]) -> list[Declared]:
        if self._writer is None:
            await self._open()
        answers: list[Declared] = []
        started = time.monotonic()
        while queues:
            writer = self._writer
            assert writer is not None
            channel = self._channel
            writer.write(
                b"".join(
                    frame.marshal(commands.Queue.Declare(queue=name, passive=True), channel)
                    for name in queues
                )
            )
            done = 0
            for name in queues:
                reply = await self._method(channel)
                if isinstance(reply, commands.Queue.DeclareOk):
                    answers.append(
                        Declared(
                            name,
                            reply.message_count or 0,
                            reply.consumer_count or 0,
                            False,
                            time.monotonic() - started,
                        )
                    )
                    done += 1
                    continue
                if isinstance(reply, commands.Channel.Close) and reply.reply_code == _NOT_FOUND:
                    # The rest of this batch was discarded with the channel.
                    writer.write(frame.marshal(commands.Channel.CloseOk(), channel))
                    answers.append(Declared(name, 0, 0, True, time.monotonic() - started))
                    done += 1
                    await self._open_channel()
                    break
                raise DeclareError(f"unexpected answer to a passive declare: {reply!r}")
            queues = queues[done:]
        return answers

    async def _open(self) -> None:
        host, port = self._addresses[0]
        user, password = self._credentials
        # No heartbeats: every exchange has its own deadline instead.  No
        # content is sent either, so the frame_max agreed does not matter.
        self._reader, self._writer, _ = await open_connection(
            host,
            port,
            user=user,
            password=password,
            vhost=self.vhost,
            name="rabbitflow gateway depth poll",
            error=DeclareError,
            what="the depth poll's connection",
            ssl_context=self._ssl,
            server_hostname=self._server_hostname,
        )
        self._channel = 0
        await self._open_channel()

    async def _open_channel(self) -> None:
        writer = self._writer
        assert writer is not None
        self._channel = self._channel % 2047 + 1
        writer.write(frame.marshal(commands.Channel.Open(), self._channel))
        opened = await self._method(self._channel)
        if not isinstance(opened, commands.Channel.OpenOk):
            raise DeclareError(f"RabbitMQ refused a channel: {opened!r}")

    async def _method(self, channel: int) -> Frame:
        """The next method frame on ``channel``; a connection close raises."""
        reader = self._reader
        assert reader is not None
        return await read_method(reader, channel, DeclareError, "the depth poll's connection")

    def _drop(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
        self._addresses.append(self._addresses.pop(0))  # next time, the next node


class DepthPoll:
    """One round of passive declares over the gateway's hot queues, reconciled.

    ``connect(vhost)`` makes the :class:`PassiveDeclarer` of a vhost; one is
    kept per vhost while it has hot queues and closed after ``idle`` seconds
    without.  The cost of a round grows with the hot queues (and, for the
    gateway's own unacknowledged deliveries, its connections), not with the
    quiet ones.
    """

    def __init__(
        self,
        gateway: Gateway,
        sources: DepthSources,
        connect: Callable[[str], PassiveDeclarer],
        *,
        idle: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway = gateway
        self._sources = sources
        self._connect = connect
        self._idle = idle
        self._monotonic = monotonic
        self._declarers: dict[str, tuple[PassiveDeclarer, float]] = {}
        self._failing: set[str] = set()

    async def poll_once(self) -> None:
        """Declare every hot queue passively and reconcile what may be adopted."""
        gateway, sources = self._gateway, self._sources
        hot = gateway.hot_queues()
        now = self._monotonic()
        if hot:
            sources.gateway_unacked(gateway.unacked_deliveries(), now)
        by_vhost: dict[str, list[str]] = {}
        for vhost, queue in hot:
            by_vhost.setdefault(vhost, []).append(queue)
        for vhost, queues in by_vhost.items():
            await self._poll_vhost(vhost, queues)
        await self._close_idle(now)

    async def _poll_vhost(self, vhost: str, queues: list[str]) -> None:
        gateway, sources = self._gateway, self._sources
        entry = self._declarers.get(vhost)
        declarer = entry[0] if entry is not None else self._connect(vhost)
        self._declarers[vhost] = (declarer, self._monotonic())
        versions = {queue: gateway.depth.version((vhost, queue)) for queue in queues}
        try:
            answers = await declarer.declare(queues)
        except DeclareError as exc:
            if vhost not in self._failing:  # once per outage, not every round
                self._failing.add(vhost)
                _log.warning("depth poll failed", vhost=vhost, error=str(exc))
            return
        if vhost in self._failing:
            self._failing.discard(vhost)
            _log.info("depth poll back", vhost=vhost)
        now = self._monotonic()
        for answer in answers:
            if answer.missing:
                continue  # a deletion is the reconciliation's to confirm
            key = (vhost, answer.queue)
            reading = sources.declared(
                key,
                ready=answer.ready,
                consumers=answer.consumers,
                elapsed=answer.elapsed,
                now=now,
            )
            if reading is not None:
                gateway.reconcile(
                    vhost,
                    answer.queue,
                    messages=reading.messages,
                    size=reading.size,
                    seen_version=versions[answer.queue],
                    settle=reading.settle,
                )

    async def _close_idle(self, now: float) -> None:
        for vhost, (declarer, used) in list(self._declarers.items()):
            if now - used > self._idle:
                del self._declarers[vhost]
                await declarer.close()

    async def close(self) -> None:
        """Close every connection."""
        declarers, self._declarers = self._declarers, {}
        for declarer, _used in declarers.values():
            await declarer.close()
