"""A cluster node's rounds: every TICK_S while it has work in hand, fewer
while it has none (its bus is not connected here: sends are dropped)."""

from __future__ import annotations

import datetime as dt

from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.cluster_node import ClusterNode

KEY = ("/", "orders")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _node() -> tuple[ClusterNode, Gateway, Clock]:
    clock = Clock()
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
        member="m1",
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
