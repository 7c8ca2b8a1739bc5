"""A member's side of the settings a cluster shares besides the flow state:
the administrator stops and the runtime thresholds (merged change by change:
:mod:`rabbitflow_broker.engine.cluster_settings`), between the hub and the bus.

A change made here goes out at once (``stops``, ``thr``); the owner's every
state carries all of them, so a member that missed one (it joined later, or
its bus reconnected) has it at the next state, and a member whose change the
owner has not taken yet says it again.  Runtime thresholds go with their
queue, as on a single gateway: a member whose hub forgot them (it saw the
queue deleted) says so, so that they never come back to a member that joins
later; each member's hub forgets its own when it sees the queue deleted.

Every method returns the messages to send to ``all``; nothing here sends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rabbitflow_broker.engine.cluster_book import MemberBook, QueueKey
from rabbitflow_broker.engine.cluster_settings import SharedStops, SharedThresholds
from rabbitflow_broker.engine.cluster_wire import read_thresholds, thresholds_message
from rabbitflow_broker.engine.flow import Thresholds

if TYPE_CHECKING:
    from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["SharedSettings"]

Message = dict[str, Any]


class SharedSettings:
    """The stops and runtime thresholds as this member shares them."""

    def __init__(self, member: str, gateway: Gateway, book: MemberBook) -> None:
        self.member = member
        self.gateway = gateway
        self.book = book
        self.stops = SharedStops(member)
        self.thresholds = SharedThresholds(member)

    # -- changes made here ------------------------------------------------------------

    def stops_changed(self) -> Message:
        """The hub's administrator stops changed: ``stops``, with every stamp."""
        self.stops.note(self.gateway.admin_stop_keys())
        return {"t": "stops", "m": self.member, **self._stops_fields()}

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds | None) -> Message:
        """Runtime thresholds set here (None: gone with the queue): ``thr``."""
        self.thresholds.set(key, thresholds)
        return self._thresholds_message(key)

    def sweep(self) -> list[Message]:
        """Hold the hub to the thresholds in force: those it forgot (it saw
        their queue deleted) are stamped gone (the messages saying so); those
        it holds otherwise (read from a store older than the cluster's
        change) are set again."""
        gone: list[Message] = []
        for key, thresholds in self.thresholds.in_force().items():
            held = self.gateway.runtime_thresholds(*key)
            if held is None:
                gone.append(self.thresholds_changed(key, None))
            elif held != thresholds:
                self._apply({key: thresholds})
        return gone

    def state_fields(self) -> Message:
        """The owner's state's part: ``stops`` (those in force: members
        without stamps read only them), ``sv`` and ``tv`` (every stamp)."""
        self.stops.note(self.gateway.admin_stop_keys())
        return {**self._stops_fields(), "tv": self.thresholds.wire()}

    # -- changes heard ------------------------------------------------------------------

    def heard_state(self, message: Message) -> list[Message]:
        """The owner's state: what it knows is taken; what this member knows
        newer is said again (the messages)."""
        out = self.sweep()
        if self.heard_stops(message):
            out.append({"t": "stops", "m": self.member, **self._stops_fields()})
        if "tv" in message:  # an owner without thresholds stamps says nothing of them
            changed, ahead = self.thresholds.merge(message["tv"])
            self._apply(changed)
            said = {(m["v"], m["q"]) for m in out if m["t"] == "thr"}
            out += [self._thresholds_message(key) for key in ahead if key not in said]
        return out

    def heard_stops(self, message: Message) -> bool:
        """Take the newer stamps of a state or a member's ``stops``; whether
        this member knows something newer than the message (to say again)."""
        if "sv" not in message:  # a member without stamps: its list as it is
            self.gateway.replace_admin_stops([(v, q) for v, q in message["stops"]])
            return False
        ahead = self.stops.merge(message["sv"])
        self.gateway.replace_admin_stops(self.stops.in_force())
        return ahead

    def heard_thresholds(self, message: Message) -> None:
        """A member's ``thr``: its change, unless this member knows a newer one."""
        if "tv" in message:
            changed, _ = self.thresholds.merge(message["tv"])
            self._apply(changed)
        else:  # a member without stamps: its change as it is
            key, thresholds = read_thresholds(message)
            self._apply({key: thresholds})

    # -- ------------------------------------------------------------------------------

    def _stops_fields(self) -> Message:
        return {"stops": [list(stop) for stop in self.stops.in_force()], "sv": self.stops.wire()}

    def _thresholds_message(self, key: QueueKey) -> Message:
        stamps = self.thresholds.wire([key])
        return thresholds_message(self.member, key, self.thresholds.get(key), stamps)

    def _apply(self, changed: dict[QueueKey, Thresholds | None]) -> None:
        """Set the thresholds that changed on the hub; those gone with their
        queue are left to it (it forgets them when it sees the queue deleted)."""
        loaded = {key: t for key, t in changed.items() if t is not None}
        if loaded:
            self.gateway.load_runtime_thresholds(loaded)
            for key in loaded:
                self.book.governed(key)  # ask before the next completion
