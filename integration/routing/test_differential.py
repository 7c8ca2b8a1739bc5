"""RoutingTable against real RabbitMQ: random topologies, every message compared.

Each seed builds a random topology in its own scratch vhost, publishes
MESSAGES_PER_TOPOLOGY messages with confirms, drains every queue and
compares where each message went with RoutingTable.route() built (a) by
replaying the declarations and (b) from the management API snapshot.
"""

from __future__ import annotations

import random

import pika
import pytest

from integration.conftest import Broker
from integration.routing._differential import (
    PREDECLARED_SOURCES,
    Topology,
    amqp_url,
    apply_policies,
    build_random_topology,
    differences,
    management_snapshot,
    observed_routes,
    predicted_routes,
    random_messages,
    random_policies,
    scratch_vhost,
)
from rabbitflow_broker.engine.routing import RoutingTable

SEEDS = range(12)
# Routing does not depend on the queue type: some seeds again with classic,
# quorum and stream queues in turn.
MIXED_SEEDS = range(3)
MIXED = ("classic", "quorum", "stream")
MESSAGES_PER_TOPOLOGY = 400


def _management_url(broker: Broker) -> str:
    if broker.management_url is None:
        pytest.fail("the differential test needs the management API")
    return broker.management_url


def _topology(
    rng: random.Random, broker: Broker, vhost: str, queue_types: tuple[str, ...] = ("classic",)
) -> Topology:
    with pika.BlockingConnection(pika.URLParameters(amqp_url(broker.url, vhost))) as connection:
        return build_random_topology(
            rng, connection.channel(), vhost=vhost, queue_types=queue_types
        )


@pytest.mark.parametrize(
    ("seed", "queue_types"),
    [(seed, ("classic",)) for seed in SEEDS] + [(seed, MIXED) for seed in MIXED_SEEDS],
    ids=[f"classic-{seed}" for seed in SEEDS] + [f"mixed-{seed}" for seed in MIXED_SEEDS],
)
def test_routing_table_predicts_every_delivery(
    broker: Broker, seed: int, queue_types: tuple[str, ...]
) -> None:
    management_url = _management_url(broker)
    rng = random.Random(seed)
    with scratch_vhost(management_url) as vhost:
        topology = _topology(rng, broker, vhost, queue_types)
        apply_policies(management_url, topology, random_policies(rng, topology))
        replayed = topology.replay()
        snapshot = RoutingTable.from_management(**management_snapshot(management_url, vhost))
        messages = random_messages(rng, topology, MESSAGES_PER_TOPOLOGY)

        observed = observed_routes(amqp_url(broker.url, vhost), topology, messages)

    assert differences(messages, observed, predicted_routes(replayed, vhost, messages)) == []
    assert differences(messages, observed, predicted_routes(snapshot, vhost, messages)) == []
    # The run must exercise something: most topologies route a good share somewhere.
    assert any(observed.values())


@pytest.mark.parametrize("seed", range(3))
def test_from_management_reproduces_a_snapshot_including_policies(
    broker: Broker, seed: int
) -> None:
    management_url = _management_url(broker)
    rng = random.Random(1000 + seed)
    with scratch_vhost(management_url) as vhost:
        topology = _topology(rng, broker, vhost)
        apply_policies(management_url, topology, random_policies(rng, topology))
        snapshot = RoutingTable.from_management(**management_snapshot(management_url, vhost))
    replayed = topology.replay()

    # Every exchange/queue pair must route alike for a spread of keys and headers.
    probes = random_messages(random.Random(seed), topology, 300)
    assert predicted_routes(snapshot, vhost, probes) == predicted_routes(replayed, vhost, probes)
    assert snapshot.queues(vhost) == replayed.queues(vhost)
    for name in [*topology.exchanges, *PREDECLARED_SOURCES]:
        assert snapshot.has_exchange(vhost, name)
        assert snapshot.is_internal(vhost, name) == (name in topology.internal)
