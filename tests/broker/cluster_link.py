"""The hub's side of a cluster member, for hub tests that leave the bus out;
and a control bus that keeps what a member sends, for cluster node tests."""

from __future__ import annotations

from typing import Any

from rabbitflow_broker.engine.cluster_book import MemberBook, OwnerBook, QueueKey
from rabbitflow_broker.engine.flow import Thresholds


class QuietLink:
    """A :class:`~rabbitflow_broker.hub.ports.ClusterLink` that tells no one:
    the member's book, and no owner book unless a test sets one."""

    def __init__(self, *, owner: bool = False, batch: int = 10) -> None:
        self.owner = owner
        self.book = MemberBook("m1", batch=batch, lease=2.0)
        self.owner_book: OwnerBook | None = None

    def kick(self) -> None:
        pass

    def flow_changed(self, key: QueueKey, stopped: bool) -> None:
        pass

    def stops_changed(self) -> None:
        pass

    def definitions_changed(self, vhost: str) -> None:
        pass

    def queue_deleted(self, vhost: str, name: str) -> None:
        pass

    def thresholds_changed(self, key: QueueKey, thresholds: Thresholds) -> None:
        pass


class EpochsRecord:
    """The epochs queue as RabbitMQ keeps it: the last epoch recorded (None:
    empty, a cluster that never had an owner).  Several buses may share one."""

    def __init__(self, epoch: int | None = None) -> None:
        self.epoch = epoch


class FakeBus:
    """A :class:`~rabbitflow_broker.server.cluster_bus.ControlBus` for a
    :class:`~rabbitflow_broker.server.cluster_node.ClusterNode`: what the node
    sends is kept in :attr:`sent`; reading and recording the epochs record is
    answered at once, or (``hold=True``) when :meth:`answer` is called, as
    RabbitMQ answers (a Basic.Get's reply, a publisher confirm)."""

    def __init__(self, node: Any, record: EpochsRecord | None = None, *, hold: bool = False):
        self.node = node
        self.record = record if record is not None else EpochsRecord()
        self.hold = hold
        self.connected = True
        self.sent: list[dict[str, Any]] = []
        #: Answers not given yet: ("read", epoch or None) or ("recorded", epoch).
        self.waiting: list[tuple[str, int | None]] = []
        self.reads = 0
        self.received = 0

    def send(self, message: dict[str, Any], *, to: str) -> bool:
        if not self.connected:
            return False
        self.sent.append(message)
        return True

    def read_epochs(self) -> bool:
        if not self.connected:
            return False
        self.reads += 1
        self._answer("read", self.record.epoch)  # RabbitMQ reads it as the Get arrives
        return True

    def record_epoch(self, epoch: int) -> bool:
        if not self.connected:
            return False
        self.record.epoch = epoch  # in place of the last one; confirmed later
        self._answer("recorded", epoch)
        return True

    def _answer(self, kind: str, value: int | None) -> None:
        self.waiting.append((kind, value))
        if not self.hold:
            self.answer()

    def answer(self, count: int | None = None) -> None:
        """Give the answers waiting (``count``: that many, oldest first)."""
        while self.waiting and (count is None or count > 0):
            kind, value = self.waiting.pop(0)
            self.node._record_answered(kind, value)
            count = None if count is None else count - 1

    def lose(self) -> None:
        """The connection ends: answers not given never come."""
        self.connected = False
        self.waiting.clear()
        self.node._lost()
