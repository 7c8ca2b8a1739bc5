"""RabbitMQ routing behaviours that surprise, each checked on the real broker.

Every test asserts the literal outcome on RabbitMQ *and* that RoutingTable
predicts the same.
"""

from __future__ import annotations

import pika
import pytest

from integration.conftest import Broker
from integration.routing._differential import (
    Message,
    Topology,
    amqp_url,
    declare_on_broker,
    observed_routes,
    scratch_vhost,
)


def run(broker: Broker, topology: Topology, message: Message) -> frozenset[str]:
    """Declare ``topology`` in a scratch vhost, publish ``message``; where did it go?

    Also asserts that RoutingTable predicts the same.
    """
    if broker.management_url is None:
        pytest.fail("needs the management API")
    with scratch_vhost(broker.management_url) as vhost:
        topology.vhost = vhost
        url = amqp_url(broker.url, vhost)
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            declare_on_broker(connection.channel(), topology)
        observed = observed_routes(url, topology, [message])[message.id]
    predicted = topology.replay().route(
        vhost, message.exchange, message.routing_key, message.headers
    )
    assert predicted == observed
    return observed


def topo(*queues: str) -> Topology:
    t = Topology("")
    for q in queues:
        t.record("declare_queue", q, None)
        t.queues.append(q)
    return t


def with_ae() -> Topology:
    """x (direct, bound to q by "k") with AE "ae" (fanout to "lost")."""
    t = topo("q", "lost")
    t.record("declare_exchange", "ae", "fanout", None)
    t.record("bind_queue", "lost", "ae", "")
    t.record("declare_exchange", "x", "direct", {"alternate-exchange": "ae"})
    t.record("bind_queue", "q", "x", "k")
    return t


def test_alternate_exchange_of_exchange_binding_destination_is_consulted(
    broker: Broker,
) -> None:
    t = with_ae()
    t.record("declare_exchange", "src", "fanout", None)
    t.record("bind_exchange", "x", "src", "")
    assert run(broker, t, Message("m", "src", "unmatched", None)) == {"lost"}


def test_matching_exchange_binding_to_dead_end_suppresses_alternate_exchange(
    broker: Broker,
) -> None:
    t = with_ae()
    t.record("declare_exchange", "dead", "direct", None)
    t.record("bind_exchange", "dead", "x", "j")
    assert run(broker, t, Message("m", "x", "j", None)) == frozenset()


def test_matching_self_binding_suppresses_alternate_exchange(broker: Broker) -> None:
    t = with_ae()
    t.record("bind_exchange", "x", "x", "j")
    assert run(broker, t, Message("m", "x", "j", None)) == frozenset()


def test_cc_applies_through_exchange_bindings_and_alternate_exchanges(broker: Broker) -> None:
    t = topo("via-e2e", "via-ae")
    t.record("declare_exchange", "ae", "direct", None)
    t.record("bind_queue", "via-ae", "ae", "cc-key")
    t.record("declare_exchange", "d", "direct", None)
    t.record("bind_queue", "via-e2e", "d", "cc-key")
    t.record("declare_exchange", "src", "fanout", None)
    t.record("bind_exchange", "d", "src", "")
    t.record("declare_exchange", "lonely", "direct", {"alternate-exchange": "ae"})
    t.record("bind_exchange", "lonely", "src", "")
    message = Message("m", "src", "k", {"CC": ["cc-key"]})
    assert run(broker, t, message) == {"via-e2e", "via-ae"}


def test_cc_applies_to_default_exchange(broker: Broker) -> None:
    t = topo("a", "b")
    assert run(broker, t, Message("m", "", "a", {"BCC": ["b"]})) == {"a", "b"}


def test_cc_byte_array_elements_are_ignored(broker: Broker) -> None:
    t = topo("a", "b")
    assert run(broker, t, Message("m", "", "a", {"CC": [b"b"]})) == {"a"}


def test_headers_exchange_does_not_see_bcc(broker: Broker) -> None:
    t = topo("q")
    t.record("declare_exchange", "h", "headers", None)
    t.record("bind_queue", "q", "h", "", {"x-match": "any", "BCC": None, "CC": None})
    assert run(broker, t, Message("m", "h", "", {"BCC": ["z"]})) == frozenset()


def test_headers_string_binding_matches_byte_array_header(broker: Broker) -> None:
    t = topo("q")
    t.record("declare_exchange", "h", "headers", None)
    t.record("bind_queue", "q", "h", "", {"a": "v"})
    assert run(broker, t, Message("m", "h", "", {"a": b"v"})) == {"q"}


def test_headers_any_without_keys_matches_nothing(broker: Broker) -> None:
    t = topo("q")
    t.record("declare_exchange", "h", "headers", None)
    t.record("bind_queue", "q", "h", "", {"x-match": "any", "x-only": 1})
    assert run(broker, t, Message("m", "h", "", {"x-only": 1})) == frozenset()
