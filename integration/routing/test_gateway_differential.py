"""The gateway's routing against RabbitMQ's, with the traffic going through the gateway.

Issue 3 item 5.  Each seed builds a random topology (all four exchange
types, exchange-to-exchange bindings, alternate exchanges, CC/BCC headers,
unbinds and deletions), publishes random messages with confirms THROUGH an
in-process gateway, then compares, for every message, the route the live
gateway computes with the queues RabbitMQ actually delivered it to, and,
for every queue, the depth the gateway counted with the number of messages
RabbitMQ held.  The queues are drained directly at RabbitMQ afterwards so
draining does not touch the gateway's counts.

Two ways the gateway learns the topology:

* ``learned``: the declarations are relayed through the gateway (no
  management snapshot after the start), so its table is built from the
  traffic it relays alone;
* ``snapshot``: the topology and policies are set directly on RabbitMQ and
  the gateway is started afterwards, so its table comes from the
  management API.

Depth reconciliation and routing refreshes are switched off so RabbitMQ's
own counts can never paper over a routing mistake.

Every topology is built of classic queues, and again of classic, quorum and
stream queues in turn (``mixed``): routing and the gateway's counts must
not depend on the queue type.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pika
import pytest

from integration.broker.conftest import RunningGateway
from integration.conftest import Broker
from integration.routing._differential import (
    Message,
    Topology,
    amqp_url,
    apply_policies,
    build_random_topology,
    differences,
    drained_routes,
    live_queues,
    publish_confirmed,
    random_messages,
    random_policies,
    scratch_vhost,
)

QUEUE_TYPES = {"classic": ("classic",), "mixed": ("classic", "quorum", "stream")}
LEARNED = [(seed, "classic") for seed in range(8)] + [(seed, "mixed") for seed in range(4)]
SNAPSHOT = [(seed, "classic") for seed in range(4)] + [(seed, "mixed") for seed in range(2)]
MESSAGES_PER_TOPOLOGY = 300
QUIET = {"routing_refresh_interval": 0, "reconcile_interval": 0}


def _management_url(broker: Broker) -> str:
    if broker.management_url is None:
        pytest.fail("the differential test needs the management API")
    return broker.management_url


def _gateway_routes(
    gateway: RunningGateway, vhost: str, messages: list[Message]
) -> dict[str, frozenset[str]]:
    service = gateway.service
    assert service is not None
    routing = service.gateway.routing
    return gateway.call(
        lambda: {m.id: routing.route(vhost, m.exchange, m.routing_key, m.headers) for m in messages}
    )


def _gateway_depths(gateway: RunningGateway, vhost: str, queues: list[str]) -> dict[str, int]:
    service = gateway.service
    assert service is not None
    depth = service.gateway.depth
    return gateway.call(lambda: {q: depth.get((vhost, q)).messages for q in queues})


def _compare(
    broker: Broker, gateway: RunningGateway, topology: Topology, messages: list[Message]
) -> None:
    vhost = topology.vhost
    publish_confirmed(amqp_url(gateway.url, vhost), messages)
    # Every publish is confirmed, so the gateway has counted each routed message.
    queues = live_queues(amqp_url(broker.url, vhost), topology)
    counted = _gateway_depths(gateway, vhost, queues)
    predicted = _gateway_routes(gateway, vhost, messages)

    observed = drained_routes(amqp_url(broker.url, vhost), topology, messages)

    assert differences(messages, observed, predicted) == []
    held = Counter(q for reached in observed.values() for q in reached)
    assert counted == {q: held[q] for q in queues}
    assert any(observed.values()), "nothing was routed anywhere: the run proves nothing"


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "queue_types"), LEARNED)
def test_gateway_routes_like_rabbitmq_from_relayed_declarations(
    broker: Broker, gateway_factory: Callable[..., RunningGateway], seed: int, queue_types: str
) -> None:
    management_url = _management_url(broker)
    rng = random.Random(seed)
    with scratch_vhost(management_url) as vhost:
        gateway = gateway_factory(**QUIET)
        url = amqp_url(gateway.url, vhost)
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            topology = build_random_topology(
                rng, connection.channel(), vhost=vhost, queue_types=QUEUE_TYPES[queue_types]
            )
        messages = random_messages(rng, topology, MESSAGES_PER_TOPOLOGY)

        _compare(broker, gateway, topology, messages)


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "queue_types"), SNAPSHOT)
def test_gateway_routes_like_rabbitmq_from_a_management_snapshot_with_policies(
    broker: Broker, gateway_factory: Callable[..., RunningGateway], seed: int, queue_types: str
) -> None:
    management_url = _management_url(broker)
    rng = random.Random(500 + seed)
    with scratch_vhost(management_url) as vhost:
        with pika.BlockingConnection(pika.URLParameters(amqp_url(broker.url, vhost))) as conn:
            topology = build_random_topology(
                rng, conn.channel(), vhost=vhost, queue_types=QUEUE_TYPES[queue_types]
            )
        apply_policies(management_url, topology, random_policies(rng, topology))
        gateway = gateway_factory(**QUIET)
        messages = random_messages(rng, topology, MESSAGES_PER_TOPOLOGY)

        _compare(broker, gateway, topology, messages)
