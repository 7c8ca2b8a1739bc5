"""A cluster node's rounds: every TICK_S while it has work in hand, fewer
while it has none (its bus is not connected here: sends are dropped, or
kept in ``sent``); its epoch when it becomes the owner, and the
administrator stops the owner's states carry."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.cluster_node import ClusterNode

KEY = ("/", "orders")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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


def _sending(member: str, clock: Clock) -> tuple[ClusterNode, Gateway, list[dict[str, Any]]]:
    """A node whose bus keeps what it sends; its hub knows the queue."""
    node, gateway, _ = _node(member, clock)
    gateway.queue_declared(*KEY, {"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 5})
    sent: list[dict[str, Any]] = []

    def send(message: dict[str, Any], *, to: str) -> bool:
        sent.append(message)
        return True

    node.bus.send = send  # type: ignore[method-assign]
    return node, gateway, sent


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
    clock = Clock()
    first, _, sent = _sending("a", clock)
    first._dispatch({"t": "hello", "m": "a", "e": 0}, True)
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
    clock = Clock()
    owner, owner_gateway, owner_sent = _sending("a", clock)
    owner._dispatch({"t": "hello", "m": "b", "e": 0}, True)
    member, gateway, _ = _sending("b", clock)
    owner_gateway.stop_producers()
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert gateway.vhost_blocked("/")
    owner_gateway.start_producers()  # its "stops" message is lost: b was reconnecting
    clock.now += 1.0
    member._dispatch(_last(owner_sent, "state", owner), False)
    assert not gateway.vhost_blocked("/")


def test_a_change_the_owner_has_not_taken_stays_and_is_sent_again() -> None:
    clock = Clock()
    owner, _, owner_sent = _sending("a", clock)
    owner._dispatch({"t": "hello", "m": "b", "e": 0}, True)
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
    clock = Clock()
    owner, owner_gateway, owner_sent = _sending("a", clock)
    owner._dispatch({"t": "hello", "m": "b", "e": 0}, True)
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
