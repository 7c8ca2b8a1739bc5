"""What a cluster member holds, and when it lets go: a queue turning OFF
pays held publishes from the allowance already held; a publish routed to no
queue is never held; a queue missing from a snapshot keeps its holds; a new
owner starts from the depth its predecessor broadcast."""

from __future__ import annotations

import datetime as dt

from rabbitflow_broker.engine.cluster import Flow, FlowUpdate, Grant
from rabbitflow_broker.engine.cluster_book import MemberBook, QueueKey
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from tests.broker.cluster_link import QuietLink

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KEY = ("/", "orders")
NAME = "/\x00orders"
REPLY_TO = "amq.rabbitmq.reply-to.g1h2AA000001"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Link(QuietLink):
    """The hub's side of a cluster member: the flow changes the owner's hub
    decides reach its own book as ClusterNode.flow_changed passes them."""

    def __init__(self, clock: Clock, *, owner: bool) -> None:
        super().__init__(owner=owner, batch=100)
        self.clock = clock

    def flow_changed(self, key: QueueKey, stopped: bool) -> None:
        update = FlowUpdate(NAME, Flow.ON if stopped else Flow.OFF, 1)
        self.book.flow(key, update, self.clock())


def _gateway(*, owner: bool = False) -> tuple[Gateway, Link, Clock]:
    clock = Clock()
    gateway = Gateway(GatewayConfig(), sink=lambda event: None, clock=lambda: NOW, monotonic=clock)
    arguments = {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}
    gateway.routing.declare_queue(*KEY, arguments)
    gateway.queue_declared(*KEY, arguments)
    link = Link(clock, owner=owner)
    gateway.join_cluster(link)
    gateway.on_change = lambda: None
    return gateway, link, clock


def _grant(book: MemberBook, amount: int, asked_at: float) -> None:
    book.granted(KEY, Grant("m1", NAME, (1 << 32) + 1, amount, asked_at, 1), asked_at)


# -- a queue turning OFF ----------------------------------------------------------


def test_a_queue_turning_off_pays_held_publishes_from_the_allowance_held() -> None:
    book = MemberBook("m1", batch=100, lease=2.0)
    _grant(book, 100, 0.0)
    book.flow(KEY, FlowUpdate(NAME, Flow.ON, 1), 0.1)
    for _ in range(5):
        assert book.publish(KEY, 10, now=0.1) is False  # ON: held
    assert KEY in book.held
    # OFF: the owner tops up no member holding a batch; the 100 held pay.
    book.flow(KEY, FlowUpdate(NAME, Flow.OFF, 1), 0.3)
    assert KEY not in book.held
    assert KEY not in book.flowed
    (entry,) = book.describe(0.3)
    assert (entry["debt"], entry["allowance"], entry["held"]) == (0, 95, False)


def test_a_queue_turning_off_asks_at_once_for_what_its_allowance_cannot_pay() -> None:
    book = MemberBook("m1", batch=100, lease=2.0)
    _grant(book, 3, 0.0)
    book.flow(KEY, FlowUpdate(NAME, Flow.ON, 1), 0.1)
    for _ in range(5):
        book.publish(KEY, 10, now=0.1)
    assert not book.flow(KEY, FlowUpdate(NAME, Flow.OFF, 1), 0.3)
    assert KEY in book.held
    assert book.describe(0.3)[0]["debt"] == 2  # 3 of 5 paid
    assert book.due  # the hub's next round asks
    (request,) = book.requests(0.3)
    assert request.queue == NAME
    assert sum(r.used for r in request.reports) == 3


def test_the_owners_hub_releases_its_own_holds_when_the_queue_turns_off() -> None:
    gateway, link, clock = _gateway(owner=True)
    _grant(link.book, 100, clock.now)
    gateway.remote_depth(KEY, 11, 0)  # other members' publishes: over stop, ON
    assert gateway.queue_on(KEY)
    for _ in range(3):
        gateway.published("/", gateway.route("/", "", "orders", None), 10)
    assert gateway.is_blocked(*KEY)
    gateway.take_changes()
    clock.now += 0.2
    gateway.remote_depth(KEY, -12, 0)  # under resume: OFF
    assert not gateway.queue_on(KEY)
    assert KEY not in link.book.held
    assert not gateway.is_blocked(*KEY)
    assert gateway.calm
    changes = gateway.take_changes()
    assert changes is not None
    assert changes.concerns("/")


# -- a publish routed to no queue ---------------------------------------------------


def test_a_direct_reply_to_is_never_held_and_an_unknown_key_is_asked_about() -> None:
    alone = Gateway(GatewayConfig(), sink=lambda event: None, clock=lambda: NOW)
    gateway, link, clock = _gateway()
    for hub in (alone, gateway):
        assert hub.route("/", "", REPLY_TO, None) == frozenset()
    # Alone, a key that names no queue routes nowhere; in a cluster it may be
    # a queue declared through another member: accounted for, and the owner
    # asked (the documented "governed on every member from its first message").
    assert alone.route("/", "", "declared-elsewhere", None) == frozenset()
    assert gateway.route("/", "", "declared-elsewhere", None) == frozenset({"declared-elsewhere"})
    for _ in range(3):
        gateway.published("/", gateway.route("/", "", REPLY_TO, None), 50)
    clock.now += 0.3
    assert link.book.tick(clock.now) == set()
    assert not link.book.held
    assert not link.book.queues
    assert link.book.requests(clock.now) == []  # nothing for the owner to look up
    assert gateway.calm


# -- a deleted queue ------------------------------------------------------------------


def test_a_queue_missing_from_a_snapshot_keeps_its_holds() -> None:
    # The management snapshot of a node that is stopping may miss a queue
    # for a moment, and the gateway takes it for deleted: its held publishes
    # must stay held (freeing them would complete them without allowance).
    gateway, link, clock = _gateway()
    gateway.published("/", frozenset({"orders"}), 50)  # no allowance yet: held
    clock.now += 0.3
    link.book.tick(clock.now)
    assert KEY in link.book.held
    gateway.queue_deleted(*KEY)
    assert KEY in link.book.held
    assert not gateway.calm


# -- a new owner -----------------------------------------------------------------------


def test_a_new_owner_starts_from_the_depth_its_predecessor_broadcast() -> None:
    # Another member owned the queue and broadcast a depth of 15 (past the
    # stop threshold of 10), counting every member's traffic; this member
    # published none of it.  Taking over, it must not judge on its own 0.
    gateway, link, _clock = _gateway()
    gateway.shared_depths({KEY: (15, 1500, 1)})
    assert gateway.depth.get(KEY).messages == 0
    link.owner = True
    gateway.take_ownership()
    assert gateway.depth.get(KEY).messages == 15
    assert gateway.queue_on(KEY)
    # A count of its own that is higher stays as it is.
    other, other_link, _ = _gateway()
    for _ in range(3):
        other.published("/", frozenset({"orders"}), 10)
    other.shared_depths({KEY: (1, 10, 0)})
    other_link.owner = True
    other.take_ownership()
    assert other.depth.get(KEY).messages == 3
