"""A member's side of the settings a cluster shares besides the flow state:
the administrator stops and the runtime thresholds (merged change by change:
:mod:`rabbitflow_broker.engine.cluster_settings`), between the hub and the bus.

A change made here goes out at once (``stops``, ``thr``), stamped with this
member's wall clock (see the engine module); the owner's every state carries
all of them, so a member that missed one (it joined later, or its bus
reconnected) has it at the next state, and a member whose change the owner
has not taken yet says it again.  A change from a member without stamps
(not upgraded yet) is stamped by the owner as it takes it, so its states
carry it as a new change.

Runtime thresholds go with their queue, as on a single gateway, once the
queue is gone for sure: a client's ``queue.delete`` went through this
member, or its hub has not known the queue for ``gone_after`` seconds
(several management snapshots in a row: one may miss a queue while a
RabbitMQ node stops, and the next lists it again).  Then they are stamped
gone, and every member's hub forgets them, so that they never come back,
nor to a member that joins later.  A hub that lost them otherwise (a
snapshot that missed the queue for a moment) has them set again.

Every method returns the messages to send to ``all``; nothing here sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rabbitflow_broker.engine.cluster_book import MemberBook, Missing, QueueKey
from rabbitflow_broker.engine.cluster_settings import SharedStops, SharedThresholds
from rabbitflow_broker.engine.cluster_wire import read_thresholds, thresholds_message
from rabbitflow_broker.engine.flow import Thresholds

if TYPE_CHECKING:
    from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["SharedSettings"]

Message = dict[str, Any]


class SharedSettings:
    """The stops and runtime thresholds as this member shares them.

    ``gone_after``: seconds a queue with runtime thresholds must stay unknown
    to the hub before they go with it; ``wall``: the wall clock, seconds (the
    stamps of changes made here).
    """

    def __init__(
        self,
        member: str,
        gateway: Gateway,
        book: MemberBook,
        *,
        gone_after: float = 3.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.member = member
        self.gateway = gateway
        self.book = book
        self.wall = wall
        self.stops = SharedStops(member)
        self.thresholds = SharedThresholds(member)
        #: Queues with runtime thresholds in force that the hub does not know, since when.
        self.missing = Missing(gone_after)

    def _now(self) -> int:
        return int(self.wall() * 1000)

    # -- changes made here ------------------------------------------------------------

    def stops_changed(self) -> Message:
        """The hub's administrator stops changed: ``stops``, with every stamp."""
        self.stops.note(self.gateway.admin_stop_keys(), self._now())
        return {"t": "stops", "m": self.member, **self._stops_fields()}

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds | None) -> Message:
        """Runtime thresholds set here (None: gone with the queue): ``thr``."""
        self.thresholds.set(key, thresholds, self._now())
        return self._thresholds_message(key)

    def queue_deleted(self, key: QueueKey) -> list[Message]:
        """A client's ``queue.delete`` went through this member (RabbitMQ
        confirmed it): the queue's runtime thresholds go on every member."""
        self.missing.forget(key)
        if self.thresholds.get(key) is None:
            return []
        return [self._gone(key)]

    def sweep(self, now: float) -> list[Message]:
        """Hold the hub to the thresholds in force (``now``: monotonic
        seconds): those of a queue it has not known for ``gone_after`` seconds
        are stamped gone (the messages saying so); those it holds otherwise
        (a snapshot missed the queue for a moment, a store older than the
        cluster's change) are set again."""
        gateway = self.gateway
        if gateway.ready_error is not None:  # no snapshot yet: it knows no queue
            self.missing.clear()
            return []
        in_force = self.thresholds.in_force()
        gone: list[Message] = []
        for key in self.missing.overdue(in_force, gateway.knows_queue, now):
            self.missing.forget(key)
            gone.append(self._gone(key))
        for key, thresholds in in_force.items():
            if gateway.knows_queue(*key) and gateway.runtime_thresholds(*key) != thresholds:
                self._apply({key: thresholds})
        return gone

    def state_fields(self) -> Message:
        """The owner's state's part: ``stops`` (those in force: members
        without stamps read only them), ``sv`` and ``tv`` (every stamp)."""
        self.stops.note(self.gateway.admin_stop_keys(), self._now())
        return {**self._stops_fields(), "tv": self.thresholds.wire()}

    # -- changes heard ------------------------------------------------------------------

    def heard_state(self, message: Message, now: float) -> list[Message]:
        """The owner's state: what it knows is taken; what this member knows
        newer is said again (the messages)."""
        out: list[Message] = []
        if self.heard_stops(message):
            out.append({"t": "stops", "m": self.member, **self._stops_fields()})
        ahead: list[QueueKey] = []
        if "tv" in message:  # an owner without thresholds stamps says nothing of them
            changed, ahead = self.thresholds.merge(message["tv"])
            self._apply(changed)
        out += self.sweep(now)  # after the merge: the hub is held to what the owner said
        said = {(m["v"], m["q"]) for m in out if m["t"] == "thr"}
        return out + [self._thresholds_message(key) for key in ahead if key not in said]

    def heard_stops(self, message: Message) -> bool:
        """Take the newer stamps of a state or a member's ``stops``; whether
        this member knows something newer than the message (to say again)."""
        if "sv" not in message:  # a member without stamps: its list as it is
            self.gateway.replace_admin_stops([(v, q) for v, q in message["stops"]])
            return False
        ahead = self.stops.merge(message["sv"])
        self.gateway.replace_admin_stops(self.stops.in_force())
        return ahead

    def heard_thresholds(self, message: Message, *, owner: bool) -> None:
        """A member's ``thr``: its change, unless this member knows a newer
        one.  One without a stamp (from a member not upgraded yet) is taken
        as it is; the owner (``owner``) stamps it as a change of its own, so
        that its states carry it instead of undoing it."""
        if "tv" in message:
            changed, _ = self.thresholds.merge(message["tv"])
            self._apply(changed)
            return
        key, thresholds = read_thresholds(message)
        if owner:
            self.thresholds.set(key, thresholds, self._now())
        self._apply({key: thresholds})

    # -- ------------------------------------------------------------------------------

    def _stops_fields(self) -> Message:
        return {"stops": [list(stop) for stop in self.stops.in_force()], "sv": self.stops.wire()}

    def _thresholds_message(self, key: QueueKey) -> Message:
        stamps = self.thresholds.wire([key])
        return thresholds_message(self.member, key, self.thresholds.get(key), stamps)

    def _gone(self, key: QueueKey) -> Message:
        """The queue is gone: its runtime thresholds go, here and (the
        message) on every member."""
        message = self.thresholds_changed(key, None)
        self._apply({key: None})
        return message

    def _apply(self, changed: dict[QueueKey, Thresholds | None]) -> None:
        """Set the thresholds that changed on the hub; those gone with their
        queue (None) are forgotten there too."""
        if not changed:
            return
        self.gateway.load_runtime_thresholds(changed)
        for key, thresholds in changed.items():
            if thresholds is not None:
                self.book.governed(key)  # ask before the next completion
