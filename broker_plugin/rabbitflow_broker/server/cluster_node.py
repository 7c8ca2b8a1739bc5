"""A gateway as a member of a cluster (asyncio): the hub's books on the bus.

:class:`ClusterNode` is the hub's :class:`~rabbitflow_broker.hub.gateway.ClusterLink`.
Per publish it only asks the :class:`~rabbitflow_broker.engine.cluster_book.MemberBook`
(no I/O); every :data:`TICK_S` it sends what the book wants to say (requests
carrying reports: at most one per half batch per queue), and while it owns
the accounting it answers requests, expires grants and broadcasts the
cluster's state.  See ``docs/cluster.md`` for the design and its bound.

The control messages are described in :mod:`rabbitflow_broker.engine.cluster_wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import structlog

from rabbitflow_broker.engine.cluster import Flow, FlowUpdate, Report, Request
from rabbitflow_broker.engine.cluster_book import GoneQueues, MemberBook, OwnerBook, QueueKey
from rabbitflow_broker.engine.cluster_claim import EpochClaim
from rabbitflow_broker.engine.cluster_wire import (
    grant_message,
    queue_name,
    read_grant,
    request_message,
)
from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.server.cluster_bus import BusError, ControlBus
from rabbitflow_broker.server.cluster_member import member_description, member_id
from rabbitflow_broker.server.cluster_shared import SharedSettings

if TYPE_CHECKING:
    from rabbitflow_broker.hub.config import GatewayConfig
    from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["ClusterNode", "member_id"]

_log = structlog.get_logger("rabbitflow.broker")

#: Seconds between the node's rounds (requests out, holds promoted) while
#: it has something in hand (see :meth:`ClusterNode.needs_rounds`).
TICK_S: Final = 0.1
#: The longest wait between rounds of a node with nothing in hand, in leases
#: (a publish, a kick or a message that gives it work starts a round at once).
IDLE_TICK_LEASES: Final = 0.25
#: Messages that never give a node work of its own to do in rounds.
_NO_ROUNDS: Final = frozenset({"hello", "depth"})
#: Seconds between broadcasts of the owner's state (also sent on each change).
STATE_EVERY_S: Final = 1.0
#: Seconds between the owner's broadcasts of every queue's depth (between
#: them, each state and each round carry the depths that changed).
DEPTHS_FULL_EVERY_S: Final = 10.0
#: At most one "definitions changed" notice per this many seconds.
DEFS_DEBOUNCE_S: Final = 0.05
#: Management snapshots in a row a queue must be missing from before its
#: allowance and grant ledger may be freed (see GoneQueues).
GONE_SNAPSHOTS: Final = 3


class ClusterNode:
    """One member: its allowances, and the owner's duties while it owns them."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        name: str,
        member: str,
        batch: int,
        lease: float,
        nodes: list[tuple[str, int]],
        user: str,
        password: str,
        describe: Callable[[], dict[str, Any]],
        refresh_routing: Callable[[], Awaitable[bool]],
        monotonic: Callable[[], float] = time.monotonic,
        gone_after: float = GONE_SNAPSHOTS * 1.0,  # snapshots every second
    ) -> None:
        self.gateway = gateway
        self.name = name
        self.member = member
        self.batch = batch
        self.lease = lease
        self._monotonic = monotonic
        self.book = MemberBook(member, batch, lease)
        self.owner = False
        self.owner_book: OwnerBook | None = None
        #: The owner's id as last broadcast (None: not known).
        self.owner_id: str | None = None
        self.epoch = 0
        #: The highest epoch any bus message carried: a new owner's is above it.
        self.seen_epoch = 0
        self.claim = EpochClaim()  # handed the owner queue: the epoch it will own with
        self._describe = describe
        self._refresh_routing = refresh_routing
        self._refreshing: asyncio.Task[None] | None = None
        self._waiting: list[dict[str, Any]] = []
        #: Members heard from: id -> (description, monotonic time).
        self.members: dict[str, tuple[dict[str, Any], float]] = {}
        #: The stops and runtime thresholds as the cluster knows them (the owner's state says).
        self.settings = SharedSettings(member, gateway, self.book, gone_after=gone_after)
        self.gone = GoneQueues(gone_after)
        self._kicked = False
        #: Whether the last round left work in hand (rounds every TICK_S).
        self._busy = True
        self._wake = asyncio.Event()
        self._refresh_again = self._defs_pending = False
        #: Owner: each queue's (messages, bytes, flowStoppedCount) as last sent.
        self._depths_sent: dict[QueueKey, tuple[int, int, int]] = {}
        self._state_sent = self._hello_sent = self._defs_sent = self._depths_full = -math.inf
        self.bus = ControlBus(
            cluster=name,
            member=member,
            nodes=nodes,
            user=user,
            password=password,
            lease=lease,
            on_message=self._received,
            on_lost=self._lost,
            on_record=self._record_answered,
        )
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def for_gateway(
        cls,
        gateway: Gateway,
        config: GatewayConfig,
        *,
        name: str,
        describe: Callable[[], dict[str, int]],
        refresh_routing: Callable[[], Awaitable[bool]],
    ) -> ClusterNode:
        """A new member for this gateway's hub, joined to it.  ``describe``
        gives the ports the gateway listens on (known once it listens)."""
        user, password = config.upstream_credentials
        node = cls(
            gateway,
            name=name,
            member=member_id(),
            batch=config.cluster_batch,
            lease=config.cluster_lease / 1000,
            nodes=config.upstream_addresses,
            user=user,
            password=password,
            describe=member_description(gateway, config, describe),
            refresh_routing=refresh_routing,
            gone_after=GONE_SNAPSHOTS * (config.reconcile_interval or 1000) / 1000,
        )
        gateway.join_cluster(node)
        return node

    # -- the hub's side (ClusterLink) ------------------------------------------------

    def kick(self) -> None:
        """A new hold, or half a grant used: ask at once rather than at the next round."""
        if self._kicked:
            return
        self._kicked = True
        self._wake.set()
        try:
            asyncio.get_running_loop().call_soon(self._kicked_round)
        except RuntimeError:
            self._kicked = False

    def _kicked_round(self) -> None:
        self._kicked = False
        now = self._monotonic()
        for request in self.book.requests(now):
            self._send_request(request)

    def flow_changed(self, key: QueueKey, stopped: bool) -> None:
        now = self._monotonic()
        update = FlowUpdate(queue_name(key), Flow.ON if stopped else Flow.OFF, self.epoch)
        if self.book.flow(key, update, now):
            self.gateway.holds_changed({key[0]})
        self._broadcast_state(now)

    def stops_changed(self) -> None:
        self.bus.send(self.settings.stops_changed(), to="all")

    def definitions_changed(self, vhost: str) -> None:
        """A declare, bind or delete went through here: the others refresh."""
        now = self._monotonic()
        if now - self._defs_sent < DEFS_DEBOUNCE_S:
            self._defs_pending = True
            return
        self._defs_sent = now
        self._defs_pending = False
        self.bus.send({"t": "defs", "m": self.member, "v": vhost}, to="all")

    def _refresh_soon(self) -> None:
        """Learn the definitions from RabbitMQ (one refresh at a time; one more
        after it when asked meanwhile)."""
        if self._refreshing is not None and not self._refreshing.done():
            self._refresh_again = True
            return

        async def refresh() -> None:
            while True:
                self._refresh_again = False
                await self._refresh_routing()
                waiting, self._waiting = self._waiting, []
                for waited in waiting:
                    key = (str(waited["v"]), str(waited["q"]))
                    if not self.gateway.knows_queue(*key):
                        self._reply(str(waited["m"]), {"t": "free", "v": key[0], "q": key[1]})
                    else:
                        self._owner_request(waited)
                if not self._refresh_again:
                    return

        self._refreshing = asyncio.get_running_loop().create_task(refresh())

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds) -> None:
        self.bus.send(self.settings.thresholds_changed(key, thresholds), to="all")

    def queue_deleted(self, vhost: str, name: str) -> None:
        """A client's queue.delete went through here: its runtime thresholds go everywhere."""
        self._send_all(self.settings.queue_deleted((vhost, name)))

    def _send_all(self, messages: Iterable[dict[str, Any]]) -> None:
        for message in messages:
            self.bus.send(message, to="all")

    # -- running ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the bus (retrying in the background) and the rounds."""
        self._tasks = [
            asyncio.create_task(self._connect_loop(), name="cluster-connect"),
            asyncio.create_task(self._tick_loop(), name="cluster-tick"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()

    async def _connect_loop(self) -> None:
        delay = 0.2
        while True:
            if not self.bus.connected:
                try:
                    await self.bus.connect()
                    _log.info("cluster bus connected", cluster=self.name, member=self.member)
                    delay = 0.2
                except BusError as exc:
                    _log.warning("cluster bus not connected", cluster=self.name, error=str(exc))
                    delay = min(delay * 2, 5.0)
            await asyncio.sleep(delay)

    async def _tick_loop(self) -> None:
        idle = min(self.lease * IDLE_TICK_LEASES, STATE_EVERY_S / 2)
        while True:
            if self._busy:
                await asyncio.sleep(TICK_S)
            else:  # nothing in hand: fewer wake-ups, until work comes
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), idle)
            now = self._monotonic()
            try:
                self.tick(now)
                self._busy = self.needs_rounds(now)
            except Exception:  # one bad round must not end the member's duties
                self._busy = True
                _log.exception("cluster round failed", cluster=self.name)

    def needs_rounds(self, now: float) -> bool:
        """Whether this node has work in hand that rounds every TICK_S serve:
        allowance in use, held or to report, definitions to announce, or, as
        the owner, grants outstanding or queues flowed or near their stop."""
        owner = self.owner_book
        return (
            self._defs_pending
            or self.book.busy(now)
            or (owner is not None and (owner.busy() or bool(self.gateway.hot_queues())))
        )

    def tick(self, now: float) -> None:
        """One round: holds promoted, requests out, the owner's duties."""
        if self._defs_pending and now - self._defs_sent >= DEFS_DEBOUNCE_S:
            self.definitions_changed("")
        promoted = self.book.tick(now)
        if promoted:
            self.gateway.holds_changed({key[0] for key in promoted})
        if now - self._hello_sent >= self.lease / 2:
            self._hello_sent = now
            hello = {"t": "hello", "m": self.member, "e": self.heard_epoch(), **self._describe()}
            self.bus.send(hello, to="owner")
            self.bus.send(hello, to="all")
        for request in self.book.requests(now):
            self._send_request(request)
        self.gone.sweep(now, self.gateway.knows_queue, self.book, self.owner_book)
        owner = self.owner_book
        if owner is not None:
            for key, expired in owner.expire(now).items():
                # Unreported grants count as enqueued until RabbitMQ's count says otherwise.
                self.gateway.remote_depth(key, expired, 0)
            if now - self._state_sent >= STATE_EVERY_S:
                if now - self._depths_full >= DEPTHS_FULL_EVERY_S:
                    self._depths_full = now
                    self._depths_sent.clear()  # every depth, for a member that missed some
                self._broadcast_state(now, self._depths(self.gateway.depth))
            # Each round: the queues flowed or near their stop (the others,
            # granted for or not, once a second above: far from their stop,
            # their depth decides nothing and would cost a message a round).
            elif depths := self._depths(self.gateway.hot_queues()):
                self.bus.send(
                    {"t": "depth", "m": self.member, "e": self.epoch, "d": depths}, to="all"
                )

    def _send_request(self, request: Request) -> None:
        message = request_message(self.member, request)
        if self.owner:
            self._owner_request(message)
        elif self.owner_id is not None:
            self.bus.send(message, to=self.owner_id)
        else:
            self.bus.send(message, to="owner")

    # -- messages -----------------------------------------------------------------

    def _received(self, message: dict[str, Any], to_owner: bool) -> None:
        if not self._busy and message.get("t") not in _NO_ROUNDS:
            self._wake.set()
        try:
            self._dispatch(message, to_owner)
        except (KeyError, TypeError, ValueError) as exc:
            _log.warning("cluster message ignored", error=repr(exc), type=message.get("t"))

    def _dispatch(self, message: dict[str, Any], to_owner: bool) -> None:
        kind = message["t"]
        now = self._monotonic()
        if "e" in message:  # hellos too: a member may never have had a state yet
            epoch = int(message["e"])
            self.seen_epoch = max(self.seen_epoch, epoch)
            if self.owner and epoch > self.epoch:  # another took a later one: its own is stale
                _log.warning("cluster owner: a later epoch heard", cluster=self.name, epoch=epoch)
                self._step_down()
        if to_owner and not self.owner:
            self._claim()
            if kind in ("req", "rep") and self.claim.keep(message):
                return  # answered once it owns
        if kind == "hello":
            if not to_owner:
                member = str(message["m"])
                known = self.members.get(member)
                if known is None or now - known[1] > self.lease:
                    self._depths_sent.clear()  # new or back: every depth at the next state
                self.members[member] = (message, now)
        elif kind in ("req", "rep"):
            if self.owner:
                self._owner_request(message)
        elif kind == "grant":
            self._granted(message, now)
        elif kind == "free":
            key = (str(message["v"]), str(message["q"]))
            if self.book.free(key, now):
                self.gateway.holds_changed({key[0]})
        elif kind == "state":
            self._state(message, now)
        elif kind == "depth":
            self._shared_depths(message)
        elif kind == "defs":
            if message["m"] != self.member:
                self._refresh_soon()
        elif kind == "stops":
            if message["m"] != self.member:
                self.settings.heard_stops(message)
        elif kind == "thr" and message["m"] != self.member:
            self.settings.heard_thresholds(message, owner=self.owner)

    def _granted(self, message: dict[str, Any], now: float) -> None:
        key, grant = read_grant(self.member, message)
        if self.book.granted(key, grant, now):
            self.gateway.holds_changed({key[0]})

    def _state(self, message: dict[str, Any], now: float) -> None:
        epoch = int(message["e"])
        sender = str(message["m"])
        if epoch < self.epoch:
            return
        if self.owner and sender != self.member:
            _log.warning("cluster owner replaced", cluster=self.name, by=sender, epoch=epoch)
            self._step_down()
        self.epoch = epoch
        self.owner_id = sender
        if sender == self.member:
            return
        on = {(str(v), str(q)) for v, q in message["on"]}
        released = set()
        for key in set(self.book.queues) | on:
            flow = Flow.ON if key in on else Flow.OFF
            if self.book.flow(key, FlowUpdate(queue_name(key), flow, epoch), now):
                released.add(key[0])  # held publishes paid from allowance held
        self.gateway.set_cluster_flow(on)
        if released:
            self.gateway.holds_changed(released)
        # The owner's stops and thresholds are the cluster's: what a member
        # missed (a lost message, a reconnect) is mended by the next state, and
        # a change the owner has not taken yet is sent again.
        self._send_all(self.settings.heard_state(message, now))
        self._shared_depths(message)

    def _shared_depths(self, message: dict[str, Any]) -> None:
        """The owner's depths (a ``depth`` message, or a ``state`` one's ``d``)."""
        if self.owner or message["m"] == self.member or int(message["e"]) < self.epoch:
            return
        depths = message.get("d") or ()
        shared = {(str(v), str(q)): (int(n), int(b), int(c)) for v, q, n, b, c in depths}
        if shared:
            self.gateway.shared_depths(shared)

    # -- the owner's duties -----------------------------------------------------------

    def heard_epoch(self) -> int:
        """The highest epoch this member knows of: its own, and every one heard."""
        return max(self.epoch, self.book.epoch, self.seen_epoch)

    def _claim(self) -> None:
        """Handed the owner queue: read the epochs record (see EpochClaim)."""
        if self.claim.start():
            self._read_record()

    def _read_record(self) -> None:
        """Ask for the epochs record; with the bus down, the claim goes with it."""
        if not self.bus.read_epochs():
            self.claim.drop()

    def _record_answered(self, kind: str, epoch: int | None) -> None:
        """The bus's answer of the epochs record: ``read`` (None: empty), or
        ``recorded`` (confirmed by RabbitMQ)."""
        if kind == "read":
            claimed = self.claim.read(epoch, self.heard_epoch())
            if claimed and not self.bus.record_epoch(claimed):
                self.claim.drop()
            return
        holds = None if epoch is None else self.claim.recorded(epoch, self.heard_epoch())
        if holds is False:  # an epoch as high was heard meanwhile: claim above it
            self._read_record()
        elif holds and epoch is not None:
            backlog = self.claim.take()
            self._become_owner(epoch)
            for message in backlog:
                self._received(message, False)

    def _become_owner(self, epoch: int) -> None:
        # Epochs only rise, above every one taken before (EpochClaim); a new
        # owner grants nothing for one lease (OwnerBook's ledgers start at
        # ``now``), so every grant of its predecessor has expired first, but
        # for the first of a cluster (epoch 1: nobody owned before it).
        now = self._monotonic()
        self.epoch = epoch
        self.owner = True
        self.owner_id = self.member
        self.owner_book = OwnerBook(self.member, self.batch, self.lease, self.epoch, now)
        self.gateway.take_ownership()
        _log.info("cluster owner", cluster=self.name, member=self.member, epoch=self.epoch)
        self._broadcast_state(now)

    def _step_down(self) -> None:
        self.owner = False
        self.owner_book = None
        self._depths_sent.clear()

    def _lost(self) -> None:
        if self.owner:
            _log.warning("cluster ownership lost with the bus", cluster=self.name)
        self.claim.drop()
        self._step_down()
        self.owner_id = None
        self.gateway.shared_depths(None)

    def _broadcast_state(self, now: float, depths: list[list[Any]] | None = None) -> None:
        if not self.owner:
            return
        self._state_sent = now
        self._send_all(self.settings.sweep(now))
        self.bus.send(
            {
                "t": "state",
                "m": self.member,
                "e": self.epoch,
                "on": [list(key) for key in self.gateway.flowed_queues()],
                **self.settings.state_fields(),
                "d": depths or [],
            },
            to="all",
        )

    def _depths(self, keys: Iterable[QueueKey]) -> list[list[Any]]:
        """The owner's [vhost, queue, messages, bytes, flowStoppedCount] of
        those of ``keys`` that changed since they were last sent."""
        gateway = self.gateway
        sent = self._depths_sent
        out: list[list[Any]] = []
        for key in keys:
            view = gateway.depth_view(key)
            if sent.get(key) != view:
                sent[key] = view
                out.append([key[0], key[1], *view])
        return out

    def _owner_request(self, message: dict[str, Any]) -> None:
        owner = self.owner_book
        if owner is None:
            return
        gateway = self.gateway
        key = (str(message["v"]), str(message["q"]))
        member = str(message["m"])
        used = used_bytes = removed = removed_bytes = 0
        for grant_id, r_used, r_removed, returned, r_used_bytes, r_removed_bytes in message["r"]:
            report = Report(
                member, queue_name(key), int(grant_id), int(r_used), int(r_removed), bool(returned)
            )
            if int(grant_id) >> 32 == owner.epoch:
                counted = owner.settle(key, report)
            else:
                counted = int(r_used)  # a predecessor's grant: its use is real
            used += counted
            if counted:
                used_bytes += int(r_used_bytes) * counted // max(int(r_used), 1)
            removed += int(r_removed)
            removed_bytes += int(r_removed_bytes)
        if member != self.member:
            # This member's own publishes and removals are counted as they happen.
            gateway.remote_depth(key, used - removed, used_bytes - removed_bytes)
        if message["t"] != "req":
            return
        if not gateway.knows_queue(*key):
            self._after_refresh(message)
            return
        thresholds = gateway.flow(key).thresholds
        if not (thresholds.stop_count or thresholds.stop_size):
            self._reply(member, {"t": "free", "v": key[0], "q": key[1]})
            return
        request = Request(member, queue_name(key), float(message["a"]))
        grant = owner.grant(
            key,
            request,
            self._monotonic(),
            on=gateway.queue_on(key),
            stop=thresholds.stop_count if not thresholds.stop_size else 0,
            depth=gateway.depth.get(key).messages,
            sharers=max(1, len(self.members)),
        )
        if grant is not None:
            self._reply(member, grant_message(key, grant))

    def _reply(self, member: str, message: dict[str, Any]) -> None:
        if member == self.member:
            self._dispatch(message, False)
        else:
            self.bus.send(message, to=member)

    def _after_refresh(self, message: dict[str, Any]) -> None:
        """A request for a queue the owner does not know: learn the
        definitions from RabbitMQ first (one refresh for all waiting)."""
        self._waiting.append({**message, "r": []})  # its reports are counted already
        self._refresh_soon()

    # -- views ----------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """The cluster as this member sees it (``GET /api/cluster``)."""
        now = self._monotonic()
        alive = 3 * self.lease
        members = [
            {
                "id": member,
                **{k: v for k, v in info.items() if k not in ("t", "m", "e")},
                "lastSeenMs": round((now - seen) * 1000),
            }
            for member, (info, seen) in sorted(self.members.items())
            if now - seen <= alive
        ]
        return {
            "name": self.name,
            "member": self.member,
            "owner": self.owner_id,
            "epoch": self.epoch,
            "batch": self.batch,
            "leaseMs": round(self.lease * 1000),
            "busConnected": self.bus.connected,
            "controlMessages": {"sent": self.bus.sent, "received": self.bus.received},
            "members": members,
            "allowances": self.book.describe(now),
        }
