"""A cluster node's rounds: every TICK_S while it has work in hand, fewer
while it has none (its bus is not connected here: sends are dropped, or
kept in ``sent``); its epoch when it becomes the owner, and the record of
it left in RabbitMQ; the administrator stops and runtime thresholds the
owner's states carry; the books of a queue that is gone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rabbitflow_broker.engine import amqp
from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.cluster_node import ClusterNode
from tests.broker.cluster_link import EpochsRecord, FakeBus

KEY = ("/", "orders")


class Clock:
    """Monotonic seconds (call it) and the wall clock's (:meth:`wall`), moved together."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_800_000_000.0 + self.now


def _node(member: str = "m1", clock: Clock | None = None) -> tuple[ClusterNode, Gateway, Clock]:
    clock = clock or Clock()
    gateway = Gateway(
        GatewayConfig(),
        sink=lambda event: None,
        clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        monotonic=clock,
    )
    gateway.routing.declare_queue(*KEY, {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5})

    async def refresh() -> bool:
        return True

    node = ClusterNode(
        gateway,
        name="test",
        member=member,
        batch=10,
        lease=2.0,
        nodes=[("127.0.0.1", 5672)],
        user="guest",
        password="guest",
        describe=dict,
        refresh_routing=refresh,
        monotonic=clock,
    )
    gateway.join_cluster(node)
    node.settings.wall = clock.wall  # stamps of changes made here
    return node, gateway, clock


def test_a_node_with_nothing_in_hand_needs_no_rounds() -> None:
    node, _, clock = _node()
    node.tick(clock.now)
    assert not node.needs_rounds(clock.now)


def test_a_publish_without_allowance_needs_rounds_until_a_lease_after_it() -> None:
    node, gateway, clock = _node()
    gateway.published("/", frozenset({"orders"}), 100)  # held: no allowance yet
    assert node.needs_rounds(clock.now)
    node.book.free(KEY, clock.now)  # the owner: no thresholds after all
    clock.now += 1.0
    node.tick(clock.now)
    assert node.needs_rounds(clock.now)  # published to within a lease
    clock.now += 2.0
    node.tick(clock.now)
    assert not node.needs_rounds(clock.now)


def _sending(
    member: str, clock: Clock, record: EpochsRecord | None = None, *, hold: bool = False
) -> tuple[ClusterNode, Gateway, list[dict[str, Any]]]:
    """A node whose bus keeps what it sends (a :class:`FakeBus`: the epochs
    record ``record``, empty by default); its hub knows the queue."""
    node, gateway, _ = _node(member, clock)
    gateway.queue_declared(*KEY, {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5})
    bus = FakeBus(node, record, hold=hold)
    node.bus = bus  # type: ignore[assignment]
    return node, gateway, bus.sent


def deleted_through(gateway: Gateway, key: tuple[str, str]) -> None:
    """A client's queue.delete went through ``gateway`` (RabbitMQ confirmed it)."""
    gateway.confirmed(key[0], amqp.QUEUE_DELETE, [0, key[1], False, False, False], [0], "")


def _request(member: str, clock: Clock) -> dict[str, Any]:
    return {"t": "req", "m": member, "v": KEY[0], "q": KEY[1], "a": clock.now, "r": []}


def test_a_member_that_only_heard_hellos_becomes_owner_above_their_epoch() -> None:
    clock = Clock()
    joined, _, sent = _sending("b", clock)
    joined._dispatch({"t": "hello", "m": "c", "e": 1}, False)  # c holds grants of epoch 1
    joined._dispatch({"t": "hello", "m": "b", "e": 0}, True)  # the owner queue: b owns
    assert joined.epoch == 2
    joined._dispatch(_request("c", clock), True)
    assert not [m for m in sent if m["t"] == "grant"]  # it waits a lease first
    clock.now += 2.0
    joined._dispatch(_request("c", clock), True)
    grants = [m for m in sent if m["t"] == "grant"]
    assert grants
    assert grants[0]["g"] >> 32 == 2  # no id of epoch 1's owner


def test_the_first_owner_grants_at_once_and_a_later_one_waits_a_lease() -> None:
    clock, first, _, sent = _owned()
    assert first.epoch == 1
    first._dispatch(_request("c", clock), True)
    assert [m for m in sent if m["t"] == "grant"]
    later, _, later_sent = _sending("b", clock)
    later._dispatch({"t": "hello", "m": "a", "e": 1}, False)  # it heard of epoch 1
    later._dispatch({"t": "hello", "m": "b", "e": 1}, True)
    assert later.epoch == 2
    later._dispatch(_request("c", clock), True)
    assert not [m for m in later_sent if m["t"] == "grant"]


def test_every_state_sets_the_stops_a_member_missed() -> None:
    clock, owner, owner_gateway, owner_sent = _owned("b")
    member, gateway, _ = _sending("b", clock)
    owner_gateway.stop_producers()
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert gateway.vhost_blocked("/")
    owner_gateway.start_producers()  # its "stops" message is lost: b was reconnecting
    clock.now += 1.0
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert not gateway.vhost_blocked("/")


def test_a_change_the_owner_has_not_taken_stays_and_is_sent_again() -> None:
    clock, owner, _, owner_sent = _owned("b")
    member, gateway, sent = _sending("b", clock)
    gateway.stop_producers(vhost="/")
    stops = [m for m in sent if m["t"] == "stops"]
    assert len(stops) == 1
    member._dispatch(_last(owner_sent, "state", owner), False)  # sent before it saw the stop
    assert gateway.vhost_blocked("/")
    assert len([m for m in sent if m["t"] == "stops"]) == 2  # said again
    owner._dispatch(sent[-1], False)
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert gateway.vhost_blocked("/")
    assert len([m for m in sent if m["t"] == "stops"]) == 2  # taken: nothing more to say


def test_two_stops_made_at_once_on_two_members_both_hold() -> None:
    clock, owner, owner_gateway, owner_sent = _owned("b")
    nodes = [_sending(member, clock) for member in ("b", "c")]
    nodes[0][1].stop_producers(vhost="x")
    nodes[1][1].stop_producers(vhost="y")
    for node, _, sent in nodes:  # each hears the other's change after its own
        other = nodes[1][2] if node is nodes[0][0] else nodes[0][2]
        node._dispatch(other[-1], False)
        owner._dispatch(sent[-1], False)
    state = _last(owner_sent, "state", owner)
    for node, gateway, _ in [*nodes]:
        node._dispatch(state, False)
        assert gateway.admin_stops() == owner_gateway.admin_stops()
    assert {stop["vhost"] for stop in owner_gateway.admin_stops()} == {"x", "y"}


def _last(sent: list[dict[str, Any]], kind: str, owner: ClusterNode) -> dict[str, Any]:
    """The owner's newest state (one broadcast now)."""
    owner._broadcast_state(owner._monotonic())
    return [m for m in sent if m["t"] == kind][-1]


def _owned(hello_from: str = "a") -> tuple[Clock, ClusterNode, Gateway, list[dict[str, Any]]]:
    """A clock, and member "a" (as :func:`_sending` makes it) become the owner:
    handed the owner queue with ``hello_from``'s hello."""
    clock = Clock()
    owner, gateway, sent = _sending("a", clock)
    owner._dispatch({"t": "hello", "m": hello_from, "e": 0}, True)
    return clock, owner, gateway, sent


# -- runtime thresholds ride every state ------------------------------------------------


def test_every_state_sets_the_runtime_thresholds_a_member_missed() -> None:
    clock, owner, owner_gateway, owner_sent = _owned("b")
    member, gateway, _ = _sending("b", clock)
    # Set on the owner while b was reconnecting its bus: its "thr" message is lost.
    owner_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 50, "flowResumeCount": 20})
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert gateway.runtime_thresholds(*KEY) == owner_gateway.runtime_thresholds(*KEY)
    assert gateway.flow(KEY).thresholds.stop_count == 50
    owner_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 70})  # lost too
    clock.now += 1.0
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert gateway.flow(KEY).thresholds.stop_count == 70


def test_a_member_that_joins_later_learns_the_runtime_thresholds_from_a_state() -> None:
    clock, owner, owner_gateway, owner_sent = _owned()
    owner_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 40})
    later, later_gateway, _ = _sending("c", clock)  # it never saw the "thr" message
    later._dispatch(_last(owner_sent, "state", owner), False)
    assert later_gateway.flow(KEY).thresholds.stop_count == 40


def test_a_threshold_change_the_owner_has_not_taken_stays_and_is_sent_again() -> None:
    clock, owner, owner_gateway, owner_sent = _owned("b")
    member, gateway, sent = _sending("b", clock)
    gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 30})
    assert len([m for m in sent if m["t"] == "thr"]) == 1
    member._dispatch(_last(owner_sent, "state", owner), False)  # sent before it saw the change
    assert gateway.flow(KEY).thresholds.stop_count == 30
    assert len([m for m in sent if m["t"] == "thr"]) == 2  # said again
    owner._dispatch(sent[-1], False)
    assert owner_gateway.flow(KEY).thresholds.stop_count == 30
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert len([m for m in sent if m["t"] == "thr"]) == 2  # taken: nothing more to say


def test_runtime_thresholds_that_went_with_their_queue_do_not_come_back() -> None:
    clock, owner, owner_gateway, owner_sent = _owned()
    owner_gateway.set_runtime_thresholds(*KEY, {"flowStopCount": 40})
    deleted_through(owner_gateway, KEY)  # its runtime thresholds go with it
    owner_gateway.routing.declare_queue(*KEY, None)
    owner_gateway.queue_declared(*KEY, None)  # a new queue of the same name
    later, later_gateway, _ = _sending("c", clock)
    later._dispatch(_last(owner_sent, "state", owner), False)
    assert later_gateway.runtime_thresholds(*KEY) is None
    assert owner_gateway.runtime_thresholds(*KEY) is None


# -- an owner's epoch is above every epoch ever taken --------------------------------------


def test_a_member_that_owns_before_hearing_anyone_takes_an_epoch_above_the_recorded_one() -> None:
    # The previous owner (epoch 1) is gone and its grants may still be in use;
    # this member joined after it and heard no message carrying its epoch, but
    # the epochs record in RabbitMQ says epoch 1 was taken.
    clock = Clock()
    joined, _, sent = _sending("c", clock, EpochsRecord(1))
    joined._dispatch({"t": "hello", "m": "c", "e": 0}, True)  # its own hello: it owns
    assert joined.epoch == 2
    assert joined.bus.record.epoch == 2  # type: ignore[attr-defined]
    joined._dispatch(_request("b", clock), True)
    assert not [m for m in sent if m["t"] == "grant"]  # a lease first


def test_a_new_owner_records_its_epoch_in_place_of_the_last() -> None:
    clock = Clock()
    record = EpochsRecord(2)
    node, _, _ = _sending("c", clock, record)
    node._dispatch({"t": "hello", "m": "b", "e": 4}, True)  # b heard of epoch 4
    assert node.epoch == 5
    assert record.epoch == 5


# -- a deleted queue's books are freed once it stays gone and nothing is held -------------


def _owner_with_a_used_grant(clock: Clock) -> tuple[ClusterNode, Gateway]:
    """An owner that granted itself allowance for KEY, used it and let it expire."""
    node, gateway, _ = _sending("a", clock)
    node._dispatch({"t": "hello", "m": "a", "e": 0}, True)
    gateway.published("/", frozenset({"orders"}), 10)  # held: no allowance yet
    node.tick(clock.now)  # asks itself: granted
    assert KEY not in node.book.held
    assert node.owner_book is not None
    assert KEY in node.owner_book.ledgers
    for _ in range(3):  # the grant expires on both sides and is reported
        clock.now += 1.0
        node.tick(clock.now)
    return node, gateway


def test_a_deleted_queue_leaves_no_allowance_or_ledger_once_it_stays_gone() -> None:
    clock = Clock()
    node, gateway = _owner_with_a_used_grant(clock)
    gateway.queue_deleted(*KEY)
    for _ in range(10):
        clock.now += 1.0
        node.tick(clock.now)
    assert node.owner_book is not None
    assert KEY not in node.book.queues
    assert KEY not in node.owner_book.ledgers
    assert not node.needs_rounds(clock.now)


def test_a_queue_missing_from_one_snapshot_keeps_its_books() -> None:
    clock = Clock()
    node, gateway = _owner_with_a_used_grant(clock)
    gateway.queue_deleted(*KEY)  # a snapshot of a stopping node missed it
    clock.now += 1.0
    node.tick(clock.now)
    gateway.queue_seen(*KEY, {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5}, None)
    for _ in range(10):
        clock.now += 1.0
        node.tick(clock.now)
    assert node.owner_book is not None
    assert KEY in node.book.queues
    assert KEY in node.owner_book.ledgers


def test_a_deleted_queue_with_held_publishes_keeps_them_until_they_are_settled() -> None:
    clock = Clock()
    node, gateway, _ = _sending("b", clock)  # no owner heard of: nothing is granted
    gateway.published("/", frozenset({"orders"}), 10)
    gateway.queue_deleted(*KEY)
    for _ in range(10):
        clock.now += 1.0
        node.tick(clock.now)
    assert KEY in node.book.held  # never completed without allowance
    node._dispatch({"t": "free", "v": KEY[0], "q": KEY[1]}, False)  # the owner: no such queue
    assert KEY not in node.book.held
    for _ in range(10):
        clock.now += 1.0
        node.tick(clock.now)
    assert KEY not in node.book.queues
