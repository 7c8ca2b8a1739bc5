"""One AMQP channel inside the connection engine (pure, sans-IO).

A :class:`Channel` follows what its client publishes (where it routes, for
depth and held confirms), its transactions, its consumers' deliveries and
acks, and the flow control the gateway applies to it.  It reaches its
connection only through :class:`Connection`: send a frame to either side,
emit an event, report a publish made while flowed.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from mypy_extensions import trait

from rabbitflow_broker.engine import amqp, amqp_encode
from rabbitflow_broker.engine.amqp import (
    SYNTAX_ERROR,
    ContentInfo,
    decode_args,
    shortstr,
    text,
    u64,
)
from rabbitflow_broker.engine.confirms import ConfirmTracker, Route
from rabbitflow_broker.engine.depth import ChannelDeliveries
from rabbitflow_broker.engine.errors import FrameError
from rabbitflow_broker.engine.flow import ThresholdError
from rabbitflow_broker.engine.mirror import NOWAIT_AT, OK_OF
from rabbitflow_broker.engine.ports import EngineSettings, Hub
from rabbitflow_broker.events import (
    ALL_QUEUES,
    ChannelClosed,
    ChannelFlowEnforced,
    ChannelFlowIgnored,
    ChannelFlowRemoved,
    Event,
)

__all__ = ["Channel", "Connection"]

_EMPTY: Route = frozenset()


@trait
class Connection:
    """What a channel may ask of its connection engine
    (:class:`~rabbitflow_broker.engine.connection.Engine` implements it; a base class
    so that, compiled, a channel's calls into it are direct calls)."""

    hub: Hub
    vhost: str
    #: The monotonic clock as of the present call into the engine.
    now: float
    settings: EngineSettings
    channels: dict[int, Channel]
    upstream_closing: dict[int, list[bytes]]
    #: The RabbitMQ node ("host:port") the upstream connection went to ("" unknown).
    upstream_node: str
    #: Whether a route is blocked, as of the last refresh.
    route_blocked: Callable[[Route], bool]

    def stamp(self) -> dt.datetime:
        """Wall-clock time of :attr:`now`, for event timestamps."""
        raise NotImplementedError

    def upstream_connection_method(self, method: int) -> None:
        """A channel-0 method from RabbitMQ on its way to the client."""
        raise NotImplementedError

    def send_client(self, channel: int, frame: bytes) -> None:
        """A frame of the gateway's own for the client."""
        raise NotImplementedError

    def send_upstream(self, frame: bytes) -> None:
        """A frame of the gateway's own for RabbitMQ."""
        raise NotImplementedError

    def emit(self, event: Event) -> None:
        """An event for the driver to log."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """Fields every connection and channel event carries."""
        raise NotImplementedError

    def flow_ignored(self, channel: Channel) -> bool:
        """Whether ``channel`` ignores flow control (and was closed for it)."""
        raise NotImplementedError

    def counted_while_flowed(self, number: int, size: int) -> None:
        """A publish on a flowed channel."""
        raise NotImplementedError

    def forget_channel(self, number: int) -> None:
        """The channel is closed on both sides."""
        raise NotImplementedError


class Channel:
    """The gateway's view of one open client channel."""

    def __init__(self, conn: Connection, number: int) -> None:
        self.conn = conn
        self.number = number
        # Requests awaiting their -ok: (ok method, request method, request args).
        self.pending: deque[tuple[int, int, list[object]]] = deque()
        self.consumers: dict[str, tuple[str, bool]] = {}
        self.deliveries = ChannelDeliveries()
        self.confirm: ConfirmTracker | None = None
        self.tx = False
        self.tx_publishes: list[tuple[Route, int]] = []
        self.tx_removals: list[tuple[str, int]] = []
        self.committing: deque[tuple[list[tuple[Route, int]], list[tuple[str, int]]]] = deque()
        self.held_commits: list[Route] = []
        self.publish: tuple[str, str] | None = None
        # The last publish's exchange and routing key as sent, and decoded.
        self._last_raw = b""
        self._last_publish: tuple[str, str] | None = None
        # The last delivery's consumer tag as sent, and decoded.
        self._last_tag_raw = b""
        self._last_tag = ""
        self.delivery: tuple[str, int, bool] | None = None  # queue, tag, no_ack
        self.last_queue = ""
        self.blockers: dict[str, None] = {}
        self.flowed_at: float | None = None
        self.ever_flowed = False
        self.publisher = False
        # The gateway closed it towards the client: drop client frames until CloseOk.
        self.closed_by_gateway = False

    # -- client methods ----------------------------------------------------------

    def client_method(self, method: int, payload: bytes) -> bool:
        """A method from the client; True to forward it.

        Raises:
            FrameError: malformed arguments of a method the gateway reads.
        """
        if self.closed_by_gateway:
            if method == amqp.CHANNEL_CLOSE_OK:
                self.closed_by_gateway = False
                self.conn.forget_channel(self.number)
            elif method == amqp.CHANNEL_CLOSE:  # both sides closing at once
                self.conn.send_client(self.number, amqp_encode.channel_close_ok(self.number))
            return False
        handler = _CLIENT.get(method)
        return True if handler is None else handler(self, method, payload)

    def keep_content(self) -> bool:
        """Whether a content frame from the client goes upstream."""
        return not self.closed_by_gateway

    def _publish(self, method: int, payload: bytes) -> bool:
        if self.conn.flow_ignored(self):
            return False
        self.start_publish(payload, 0)
        return True

    def start_publish(self, data: bytes, start: int) -> None:
        """Note where the publish whose method payload starts at ``data[start]``
        goes, until its header gives the size.

        Raises:
            FrameError: malformed Basic.Publish.
        """
        first = start + 6
        try:
            end = first + 1 + data[first]
            end += 1 + data[end]
        except IndexError:
            raise FrameError(SYNTAX_ERROR, "malformed basic.publish") from None
        raw = data[first:end]
        if raw == self._last_raw:  # publishers mostly repeat their destination
            self.publish = self._last_publish
            return
        try:
            exchange, pos = shortstr(data, first)
            routing_key, _ = shortstr(data, pos)
        except IndexError:
            raise FrameError(SYNTAX_ERROR, "malformed basic.publish") from None
        self.publish = self._last_publish = (exchange, routing_key)
        self._last_raw = raw

    def published(self, info: ContentInfo) -> None:
        """The content header of the channel's publish: route and count it."""
        if self.publish is None:
            return
        exchange, routing_key = self.publish
        self.publish = None
        self.publisher = True
        conn = self.conn
        hub = conn.hub
        size = info.body_size
        if self.blockers:
            conn.counted_while_flowed(self.number, size)
        vhost = conn.vhost
        route = hub.route(vhost, exchange, routing_key, info.headers)
        if info.persistent and route and hub.store_quota_on:
            # Counted at publish even in a transaction: early, never late.
            hub.persistent_published(vhost, size * len(route))
        if self.tx:
            self.tx_publishes.append((route, size))
        elif route:
            hub.published(vhost, route, size)
        if self.confirm is not None:
            self.confirm.published(route)
        if not hub.calm and ((route and conn.route_blocked(route)) or hub.vhost_blocked(vhost)):
            self.block_on(route)

    def _declare(self, method: int, payload: bytes) -> bool:
        args = decode_args(method, payload)
        arguments = args[7] if isinstance(args[7], dict) else {}
        if not args[2]:
            try:
                self.conn.hub.validate_declare(arguments)
            except ThresholdError as exc:
                self.close(amqp.PRECONDITION_FAILED, str(exc), method)
                return False
        return self._sync(method, payload, args)

    def _sync(self, method: int, payload: bytes, args: list[object] | None = None) -> bool:
        if args is None:
            args = decode_args(method, payload)
        at = NOWAIT_AT.get(method)
        if at is not None and args[at]:
            self._confirmed(method, args, None)
        else:
            self.pending.append((OK_OF[method], method, args))
        return True

    def _ack(self, method: int, payload: bytes) -> bool:
        tag, multiple, requeue = _ack_fields(method, payload)
        if method != amqp.BASIC_ACK and requeue:
            self.deliveries.settle(tag, multiple)
        else:
            self.acked(tag, multiple)
        return True

    def acked(self, tag: int, multiple: bool) -> None:
        """The client acknowledged (or dropped) deliveries up to ``tag``: they
        leave their queues (at commit, in a transaction)."""
        settled = self.deliveries.settle(tag, multiple)
        hub, vhost = self.conn.hub, self.conn.vhost
        for delivery in settled:
            if self.tx:
                self.tx_removals.append((delivery.queue, delivery.size))
            else:
                hub.removed(vhost, delivery.queue, 1, delivery.size)

    def _requeue(self, method: int, payload: bytes) -> bool:
        self.deliveries.requeue_all()
        return True

    def _client_close_ok(self, method: int, payload: bytes) -> bool:
        self.conn.forget_channel(self.number)
        return True

    def _drop(self, method: int, payload: bytes) -> bool:
        return False  # Channel.FlowOk answers the gateway's own Channel.Flow

    def _confirm_select(self, method: int, payload: bytes) -> bool:
        if self.confirm is None:
            self.confirm = ConfirmTracker()
        return True

    def _tx_select(self, method: int, payload: bytes) -> bool:
        self.tx = True
        return True

    def _tx_commit(self, method: int, payload: bytes) -> bool:
        self.committing.append((self.tx_publishes, self.tx_removals))
        self.tx_publishes, self.tx_removals = [], []
        return True

    def _tx_rollback(self, method: int, payload: bytes) -> bool:
        self.tx_publishes, self.tx_removals = [], []
        return True

    def close(self, code: int, reason: str, method: int = 0) -> None:
        """Close the channel towards the client and upstream; the rest go on.

        Frames the client still sends on it are dropped until its
        ``Channel.CloseOk``; a reopen of the number waits until RabbitMQ has
        closed its side.
        """
        if self.closed_by_gateway:
            return
        number = self.number
        self.conn.send_client(
            number,
            amqp_encode.close_frame(number, code, amqp.reply_text(code, reason), method),
        )
        self.conn.send_upstream(amqp_encode.close_frame(number, 200, "closed by gateway"))
        self.blockers.clear()
        self.closed_by_gateway = True
        self.conn.upstream_closing[number] = []
        self.deliveries.requeue_all()

    # -- upstream methods ---------------------------------------------------------

    def upstream_method(self, method: int, payload: bytes) -> bool:
        """A method from RabbitMQ; True to forward it to the client."""
        handler = _UPSTREAM.get(method)
        return True if handler is None else handler(self, method, payload)

    def _u_close(self, method: int, payload: bytes) -> bool:
        self.deliveries.requeue_all()
        self.pending.clear()
        return True

    def _u_close_ok(self, method: int, payload: bytes) -> bool:
        self.conn.forget_channel(self.number)
        return True

    def _pop_pending(self, ok: int) -> tuple[int, list[object]] | None:
        while self.pending:
            expected, request, args = self.pending.popleft()
            if expected == ok:
                return request, args
        return None

    def _u_sync_ok(self, method: int, payload: bytes) -> bool:
        found = self._pop_pending(method)
        if found is not None:
            request, args = found
            try:
                reply = decode_args(method, payload) if method in _REPLY_ARGS else []
            except FrameError:
                return True
            self._confirmed(request, args, reply)
        return True

    def _confirmed(self, request: int, args: list[object], reply: list[object] | None) -> None:
        if request == amqp.QUEUE_DECLARE:
            self.last_queue = text(reply[0]) if reply else text(args[1])
        elif request == amqp.BASIC_CONSUME:
            tag = text(reply[0]) if reply else text(args[2])
            self.consumers[tag] = (text(args[1]) or self.last_queue, bool(args[4]))
            return
        elif request == amqp.BASIC_CANCEL:
            self.consumers.pop(text(args[0]), None)
            return
        elif request == amqp.BASIC_GET:
            if reply:
                self.delivery = (text(args[1]) or self.last_queue, int(reply[0]), bool(args[2]))  # type: ignore[call-overload]
            return
        self.conn.hub.confirmed(self.conn.vhost, request, args, reply, self.last_queue)

    def _u_get_empty(self, method: int, payload: bytes) -> bool:
        self._pop_pending(amqp.BASIC_GET_OK)
        return True

    def _u_cancel(self, method: int, payload: bytes) -> bool:
        try:
            tag, _ = shortstr(payload, 4)
        except IndexError:
            return True
        self.consumers.pop(tag, None)
        return True

    def deliver(self, data: bytes, start: int) -> bool:
        """Basic.Deliver (payload at ``data[start]``): the next content header
        on the channel is its message."""
        first = start + 4
        try:
            pos = first + 1 + data[first]
            raw = data[first:pos]
            if raw == self._last_tag_raw:  # deliveries mostly repeat their consumer
                tag = self._last_tag
            else:
                tag, pos = shortstr(data, first)
                self._last_tag_raw, self._last_tag = raw, tag
            delivery_tag = u64(data, pos)
        except IndexError:
            return True
        consumer = self.consumers.get(tag)
        if consumer is not None:
            self.delivery = (consumer[0], delivery_tag, consumer[1])
        return True

    def _u_deliver(self, method: int, payload: bytes) -> bool:
        return self.deliver(payload, 0)

    def delivered(self, size: int) -> None:
        """The content header of a delivery gave its size: count it."""
        if self.delivery is None:
            return
        queue, tag, no_ack = self.delivery
        self.delivery = None
        if no_ack:
            self.conn.hub.removed(self.conn.vhost, queue, 1, size)
        else:
            self.deliveries.delivered(tag, queue, size)

    def _u_confirm(self, method: int, payload: bytes) -> bool:
        tracker = self.confirm
        if tracker is None:
            return True
        tag, multiple, _requeue = _ack_fields(method, payload)
        hub, vhost = self.conn.hub, self.conn.vhost
        if method == amqp.BASIC_ACK and self.ack_as_is(tracker, tag, multiple):
            return True
        if method == amqp.BASIC_ACK:
            confirms, held = tracker.upstream_ack(tag, multiple, self.conn.route_blocked)
            # A held confirm flows the channel that published it too.
            for route in held:
                self.block_on(route)
        else:
            confirms, routes = tracker.upstream_nack(tag, multiple)
            # A nacked publish was not enqueued (e.g. reject-publish overflow).
            for route in routes:
                for queue in route:
                    hub.removed(vhost, queue, 1, 0)
        if len(confirms) == 1 and confirms[0].tag == tag and confirms[0].multiple == multiple:
            return True
        for confirm in confirms:
            self.conn.send_client(
                self.number,
                amqp_encode.confirm_frame(self.number, confirm.tag, confirm.multiple, confirm.ack),
            )
        return False

    def ack_as_is(self, tracker: ConfirmTracker, tag: int, multiple: bool) -> bool:
        """Record an upstream ack of ``tracker`` (this channel's) that may go
        to the client as it came (:meth:`ConfirmTracker.ack_one` /
        :meth:`~ConfirmTracker.ack_upto`); False changes nothing."""
        conn = self.conn
        blocked = None if conn.hub.calm else conn.route_blocked
        return tracker.ack_upto(tag, blocked) if multiple else tracker.ack_one(tag, blocked)

    def _u_commit_ok(self, method: int, payload: bytes) -> bool:
        if not self.committing:
            return True
        publishes, removals = self.committing.popleft()
        hub, vhost = self.conn.hub, self.conn.vhost
        route: set[str] = set()
        for queues, size in publishes:
            if queues:
                hub.published(vhost, queues, size)
                route.update(queues)
        for queue, size in removals:
            hub.removed(vhost, queue, 1, size)
        frozen = frozenset(route)
        if frozen and hub.route_blocker(vhost)(frozen):
            self.held_commits.append(frozen)
            self.block_on(frozen)
            return False
        if self.held_commits:
            self.held_commits.append(_EMPTY)  # keep commit-oks in order
            return False
        return True

    def _u_pass(self, method: int, payload: bytes) -> bool:
        return True

    # -- flow control --------------------------------------------------------------

    def block_on(self, route: Route) -> None:
        """Record every blocker of a route; the first one flows the channel."""
        conn = self.conn
        for blocker in conn.hub.blockers(conn.vhost, route):
            if blocker not in self.blockers:
                self._block(blocker)

    def _block(self, blocker: str) -> None:
        first = not self.blockers
        self.blockers[blocker] = None
        if not first:
            return
        conn = self.conn
        # CHN-1005's timestamp and the enforcement clock are the same instant
        # (conn.now), so CHN-1012 is never logged less than the timeout after it.
        ts = conn.stamp()
        self.flowed_at = conn.now
        self.ever_flowed = True
        conn.send_client(self.number, amqp_encode.flow_frame(self.number, False))
        conn.emit(ChannelFlowEnforced(ts=ts, channel=self.number, queue=blocker, **conn.identity()))

    def refresh(self, blocked: Callable[[Route], bool], vhost_blocked: bool) -> None:
        """Release what no longer needs holding; unflow the channel when freed."""
        conn = self.conn
        number = self.number
        if self.closed_by_gateway or number in conn.upstream_closing:
            return
        if self.confirm is not None and self.confirm.held:
            for confirm in self.confirm.release(blocked):
                conn.send_client(
                    number,
                    amqp_encode.confirm_frame(number, confirm.tag, confirm.multiple, confirm.ack),
                )
        while self.held_commits and not blocked(self.held_commits[0]):
            self.held_commits.pop(0)
            conn.send_client(number, amqp_encode.commit_ok(number))
        if vhost_blocked and self.publisher:
            self._block(ALL_QUEUES)
        if self.blockers:
            for blocker in list(self.blockers):
                if not conn.hub.blocker_active(conn.vhost, blocker):
                    del self.blockers[blocker]
            if not self.blockers:
                self.flowed_at = None
                conn.send_client(number, amqp_encode.flow_frame(number, True))
                conn.emit(ChannelFlowRemoved(ts=conn.stamp(), channel=number, **conn.identity()))

    def event_ignored(self) -> ChannelFlowIgnored:
        """CHN-1012 for this channel."""
        return ChannelFlowIgnored(ts=self.conn.stamp(), channel=self.number, **self.conn.identity())

    def event_closed(self) -> ChannelClosed:
        """CHN-1003 for this channel."""
        return ChannelClosed(ts=self.conn.stamp(), channel=self.number, **self.conn.identity())

    # -- views -----------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Confirms and commit-oks held from the client."""
        return (self.confirm.held if self.confirm is not None else 0) + len(self.held_commits)

    @property
    def in_flight(self) -> int:
        """Publishes whose confirm or commit-ok the client still waits for."""
        tracker = self.confirm
        waiting = tracker.outstanding if tracker is not None else 0
        return waiting + len(self.committing) + len(self.held_commits)

    def describe(self) -> dict[str, Any]:
        """Admin API fields of the channel."""
        return {
            "flowStopped": bool(self.blockers),
            "blockedOn": list(self.blockers),
            "confirmMode": self.confirm is not None,
            "transactional": self.tx,
            "heldConfirms": self.confirm.held if self.confirm else 0,
            "heldCommits": len(self.held_commits),
            "unackedDeliveries": len(self.deliveries),
            "consumers": len(self.consumers),
        }


def _ack_fields(method: int, payload: bytes) -> tuple[int, bool, bool]:
    """(delivery tag, multiple, requeue) of Basic.Ack / Reject / Nack.

    Raises:
        FrameError: truncated arguments.
    """
    if len(payload) < 13:
        raise FrameError(SYNTAX_ERROR, f"malformed {amqp.method_name(method)}")
    tag = u64(payload, 4)
    bits = payload[12]
    if method == amqp.BASIC_REJECT:
        return tag, False, bool(bits & 1)
    if method == amqp.BASIC_NACK:
        return tag, bool(bits & 1), bool(bits & 2)
    return tag, bool(bits & 1), False


_Handler = Callable[[Channel, int, bytes], bool]

_CLIENT: Final[dict[int, _Handler]] = {
    amqp.CHANNEL_CLOSE: lambda ch, m, p: ch._requeue(m, p),
    amqp.CHANNEL_CLOSE_OK: Channel._client_close_ok,
    amqp.CHANNEL_FLOW_OK: Channel._drop,
    amqp.QUEUE_DECLARE: Channel._declare,
    **{m: Channel._sync for m in OK_OF if m not in (amqp.QUEUE_DECLARE,)},
    amqp.BASIC_PUBLISH: Channel._publish,
    amqp.BASIC_ACK: Channel._ack,
    amqp.BASIC_REJECT: Channel._ack,
    amqp.BASIC_NACK: Channel._ack,
    amqp.BASIC_RECOVER: Channel._requeue,
    amqp.BASIC_RECOVER_ASYNC: Channel._requeue,
    amqp.CONFIRM_SELECT: Channel._confirm_select,
    amqp.TX_SELECT: Channel._tx_select,
    amqp.TX_COMMIT: Channel._tx_commit,
    amqp.TX_ROLLBACK: Channel._tx_rollback,
}

#: -ok methods whose arguments the gateway reads.
_REPLY_ARGS: Final = frozenset(
    {amqp.QUEUE_DECLARE_OK, amqp.QUEUE_PURGE_OK, amqp.BASIC_CONSUME_OK, amqp.BASIC_GET_OK}
)

_UPSTREAM: Final[dict[int, _Handler]] = {
    amqp.CHANNEL_CLOSE: Channel._u_close,
    amqp.CHANNEL_CLOSE_OK: Channel._u_close_ok,
    **dict.fromkeys(OK_OF.values(), Channel._u_sync_ok),
    amqp.BASIC_GET_EMPTY: Channel._u_get_empty,
    amqp.BASIC_CANCEL: Channel._u_cancel,
    amqp.BASIC_DELIVER: Channel._u_deliver,
    amqp.BASIC_ACK: Channel._u_confirm,
    amqp.BASIC_NACK: Channel._u_confirm,
    amqp.TX_COMMIT_OK: Channel._u_commit_ok,
    amqp.TX_ROLLBACK_OK: Channel._u_pass,
}
