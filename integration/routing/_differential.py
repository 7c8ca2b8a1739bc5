"""Differential routing harness: random topologies on a real broker vs RoutingTable.

Reusable by other suites (e.g. through the gateway): every function takes
the AMQP URL and the management URL, and the topology is data that can be
replayed into a :class:`RoutingTable`.

Typical use::

    with scratch_vhost(management_url) as vhost:
        with pika.BlockingConnection(pika.URLParameters(amqp_url(base, vhost))) as conn:
            topology = build_random_topology(rng, conn.channel())
        wait_for_policies(management_url, vhost, topology)
        messages = random_messages(rng, topology, 300)
        observed = observed_routes(amqp_url(base, vhost), topology, messages)
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika

from rabbitflow_broker.engine.routing import RoutingTable

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
WORDS = ("a", "b", "c", "")
HEADER_KEYS = ("h1", "h2", "x-h")
HEADER_VALUES: tuple[object, ...] = ("v1", "v2", 1, 2, True, b"v1", None)
PREDECLARED_SOURCES = ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match")


# --- management API -------------------------------------------------------------------


def management(management_url: str, method: str, path: str, body: object | None = None) -> Any:
    """Call the management API as guest; returns the decoded JSON (or None)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(management_url + path, data=data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@contextlib.contextmanager
def scratch_vhost(management_url: str) -> Iterator[str]:
    """A fresh vhost with full permissions for guest; deleted afterwards."""
    vhost = f"rf-routing-{uuid.uuid4().hex[:10]}"
    management(management_url, "PUT", f"/api/vhosts/{_q(vhost)}", {})
    try:
        management(
            management_url,
            "PUT",
            f"/api/permissions/{_q(vhost)}/guest",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )
        yield vhost
    finally:
        with contextlib.suppress(urllib.error.HTTPError):
            management(management_url, "DELETE", f"/api/vhosts/{_q(vhost)}")


def amqp_url(base_url: str, vhost: str) -> str:
    """``base_url`` (``amqp://user:pass@host:port``) with ``vhost`` as its path."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + _q(vhost)))


def management_snapshot(management_url: str, vhost: str) -> dict[str, list[dict[str, Any]]]:
    """The vhost's exchanges, queues, bindings and policies as the management API lists them."""
    v = _q(vhost)
    return {
        kind: management(management_url, "GET", f"/api/{kind}/{v}")
        for kind in ("exchanges", "queues", "bindings", "policies")
    }


# --- topology ---------------------------------------------------------------------------


@dataclass
class Topology:
    """What was declared, in order, as RoutingTable calls (see :meth:`replay`)."""

    vhost: str
    operations: list[tuple[str, tuple[object, ...], dict[str, object]]] = field(
        default_factory=list
    )
    exchanges: dict[str, str] = field(default_factory=dict)  # name -> type (live only)
    internal: set[str] = field(default_factory=set)
    queues: list[str] = field(default_factory=list)  # every queue ever declared
    queue_types: dict[str, str] = field(default_factory=dict)  # name -> x-queue-type
    policies: list[dict[str, object]] = field(default_factory=list)

    def record(self, op: str, *args: object, **kwargs: object) -> None:
        self.operations.append((op, args, kwargs))

    def replay(self, table: RoutingTable | None = None) -> RoutingTable:
        """Apply every recorded operation to ``table`` (a new one by default)."""
        table = table if table is not None else RoutingTable()
        for op, args, kwargs in self.operations:
            getattr(table, op)(self.vhost, *args, **kwargs)
        return table

    def publishable_exchanges(self) -> list[str]:
        return ["", *PREDECLARED_SOURCES, *(x for x in self.exchanges if x not in self.internal)]


def _random_key(rng: random.Random, *, wildcards: bool) -> str:
    alphabet = (*WORDS, "*", "#") if wildcards else WORDS
    if rng.random() < 0.1:
        return ""
    return ".".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))


def _random_binding_args(rng: random.Random, source_type: str) -> dict[str, object] | None:
    if source_type != "headers":
        # Arguments on other types are part of the binding's identity only.
        return {"tag": rng.randint(0, 1)} if rng.random() < 0.1 else None
    args: dict[str, object] = {}
    if rng.random() < 0.85:
        args["x-match"] = rng.choice(("all", "any", "all-with-x", "any-with-x"))
    for key in rng.sample(HEADER_KEYS, rng.randint(0, len(HEADER_KEYS))):
        args[key] = rng.choice(HEADER_VALUES)
    return args


def build_random_topology(
    rng: random.Random,
    channel: Any,
    *,
    vhost: str,
    n_exchanges: int = 8,
    n_queues: int = 8,
    n_queue_bindings: int = 22,
    n_exchange_bindings: int = 10,
    queue_types: Sequence[str] = ("classic",),
) -> Topology:
    """Declare a random topology through ``channel`` (pika, on ``vhost``) and record it.

    Exchanges of all four types, some internal, some with an
    ``alternate-exchange`` argument (possibly naming a missing exchange);
    queue and exchange-to-exchange bindings (self-bindings and cycles
    included, also from the ``amq.*`` exchanges); then a few unbinds and one
    queue and one exchange deletion.  Policies are not set here: see
    :func:`random_policies`.  Queue ``i`` is of type ``queue_types[i % n]``
    (quorum queues and streams durable, as RabbitMQ requires); the types do
    not change the random choices, so a seed builds the same topology.
    """
    topo = Topology(vhost)
    names = [f"x{i}" for i in range(n_exchanges)]
    for name in names:
        type_ = EXCHANGE_TYPES[rng.randrange(len(EXCHANGE_TYPES))]
        internal = rng.random() < 0.15
        args: dict[str, object] = {}
        if rng.random() < 0.35:
            args["alternate-exchange"] = rng.choice([*names, "missing-ae", "amq.fanout"])
        channel.exchange_declare(name, type_, internal=internal, arguments=args or None)
        topo.record("declare_exchange", name, type_, args or None, internal=internal)
        topo.exchanges[name] = type_
        if internal:
            topo.internal.add(name)
    for i in range(n_queues):
        queue = f"q{i}"
        queue_type = queue_types[i % len(queue_types)]
        queue_args = None if queue_type == "classic" else {"x-queue-type": queue_type}
        channel.queue_declare(queue, durable=queue_args is not None, arguments=queue_args)
        topo.record("declare_queue", queue, queue_args)
        topo.queues.append(queue)
        topo.queue_types[queue] = queue_type

    types = {**topo.exchanges, "amq.direct": "direct", "amq.fanout": "fanout"}
    types |= {"amq.topic": "topic", "amq.headers": "headers", "amq.match": "headers"}
    sources = [*names, *PREDECLARED_SOURCES[:2], *PREDECLARED_SOURCES[2:]]
    bindings: list[tuple[str, str, str, str, dict[str, object] | None]] = []
    for _ in range(n_queue_bindings):
        source = rng.choice(names) if rng.random() < 0.85 else rng.choice(sources)
        queue = rng.choice(topo.queues)
        key = _random_key(rng, wildcards=types[source] == "topic")
        args = _random_binding_args(rng, types[source])
        channel.queue_bind(queue, source, key, arguments=args)
        topo.record("bind_queue", queue, source, key, args)
        bindings.append(("queue", queue, source, key, args))
    for _ in range(n_exchange_bindings):
        source = rng.choice(sources)
        destination = rng.choice(names)
        key = _random_key(rng, wildcards=types[source] == "topic")
        args = _random_binding_args(rng, types[source])
        channel.exchange_bind(destination, source, key, arguments=args)
        topo.record("bind_exchange", destination, source, key, args)
        bindings.append(("exchange", destination, source, key, args))

    for kind, dest, source, key, args in rng.sample(bindings, 2):
        if kind == "queue":
            channel.queue_unbind(dest, source, key, arguments=args)
            topo.record("unbind_queue", dest, source, key, args)
        else:
            channel.exchange_unbind(dest, source, key, arguments=args)
            topo.record("unbind_exchange", dest, source, key, args)
    if rng.random() < 0.5:
        doomed = rng.choice(topo.queues)
        channel.queue_delete(doomed)
        topo.record("delete_queue", doomed)
    if rng.random() < 0.5:
        doomed_x = rng.choice(names)
        channel.exchange_delete(doomed_x)
        topo.record("delete_exchange", doomed_x)
        del topo.exchanges[doomed_x]
        topo.internal.discard(doomed_x)
    return topo


def random_policies(rng: random.Random, topology: Topology) -> list[dict[str, object]]:
    """One or two policies giving some exchanges an alternate exchange.

    With two, the higher-priority one sometimes has no ``alternate-exchange``
    (it then shadows the other entirely) or applies only to queues.
    """
    live = list(topology.exchanges)
    target = rng.choice([*live, "missing-ae"]) if live else "amq.fanout"
    pattern = rng.choice(("^x[0-3]$", "x[2-7]", "^x", "^amq\\.(direct|topic)$"))
    policies: list[dict[str, object]] = [
        {
            "name": "ae",
            "pattern": pattern,
            "apply-to": rng.choice(("exchanges", "all")),
            "priority": 1,
            "definition": {"alternate-exchange": target},
        }
    ]
    if rng.random() < 0.5:
        policies.append(
            {
                "name": "shadow",
                "pattern": rng.choice(("^x[0-1]$", "5")),
                "apply-to": rng.choice(("exchanges", "all", "queues")),
                "priority": rng.choice((0, 2)),
                "definition": {"max-length": 1000},
            }
        )
    return policies


def apply_policies(
    management_url: str, topology: Topology, policies: Sequence[dict[str, object]]
) -> None:
    """Set ``policies`` on the broker, record them, and wait until exchanges carry them."""
    v = _q(topology.vhost)
    for policy in policies:
        body = {k: policy[k] for k in ("pattern", "apply-to", "priority", "definition")}
        management(management_url, "PUT", f"/api/policies/{v}/{_q(str(policy['name']))}", body)
    topology.policies = list(policies)
    topology.record("set_policies", list(policies))
    expected = {name: _expected_policy(policies, name) for name in topology.exchanges}
    expected |= {name: _expected_policy(policies, name) for name in PREDECLARED_SOURCES}
    deadline = time.monotonic() + 20
    while True:
        listed = management(management_url, "GET", f"/api/exchanges/{v}")
        actual = {x["name"]: x.get("policy") or None for x in listed}
        if all(actual.get(name) == want for name, want in expected.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"policies not applied within 20 s: {actual} != {expected}")
        time.sleep(0.05)


def _expected_policy(policies: Sequence[Mapping[str, object]], name: str) -> str | None:
    ranked = sorted(policies, key=lambda p: -int(str(p["priority"])))
    for p in ranked:
        if p["apply-to"] in ("exchanges", "all") and re.search(str(p["pattern"]), name):
            return str(p["name"])
    return None


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One publish: its id travels as the body."""

    id: str
    exchange: str
    routing_key: str
    headers: dict[str, object] | None


def random_messages(rng: random.Random, topology: Topology, count: int) -> list[Message]:
    """``count`` publishes with random exchanges, keys, headers, CC and BCC."""
    targets = topology.publishable_exchanges()
    messages = []
    for i in range(count):
        exchange = rng.choice(targets)
        if exchange == "" or rng.random() < 0.1:
            key = rng.choice([*topology.queues, "nope", "a"])
        else:
            key = _random_key(rng, wildcards=False)
        headers: dict[str, object] = {}
        for name in rng.sample(HEADER_KEYS, rng.randint(0, len(HEADER_KEYS))):
            headers[name] = rng.choice(HEADER_VALUES)
        for name in ("CC", "BCC"):
            if rng.random() < 0.2:
                pool = [*topology.queues, "a", "b.c", "a.b", b"q0", b"a"]
                headers[name] = rng.sample(pool, rng.randint(0, 3))
        messages.append(Message(f"m{i}", exchange, key, headers or None))
    return messages


def observed_routes(
    url: str, topology: Topology, messages: Sequence[Message]
) -> dict[str, frozenset[str]]:
    """Publish every message with confirms, drain every queue, say where each went.

    Raises AssertionError when a message reached a queue twice or a
    delivery is not one of ours.
    """
    publish_confirmed(url, messages)
    return drained_routes(url, topology, messages)


def publish_confirmed(url: str, messages: Sequence[Message]) -> None:
    """Publish every message on one channel with publisher confirms (through ``url``)."""
    parameters = pika.URLParameters(url)
    with contextlib.closing(pika.BlockingConnection(parameters)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for m in messages:
            channel.basic_publish(
                m.exchange,
                m.routing_key,
                m.id.encode(),
                pika.BasicProperties(headers=m.headers),
            )


def drained_routes(
    url: str, topology: Topology, messages: Sequence[Message]
) -> dict[str, frozenset[str]]:
    """Drain every live queue of ``topology`` and say which queues each message reached.

    Call it once every publish is confirmed: each routed message is then in
    its queues.

    Raises AssertionError when a message reached a queue twice or a
    delivery is not one of ours.
    """
    reached: dict[str, set[str]] = {m.id: set() for m in messages}
    parameters = pika.URLParameters(url)
    with contextlib.closing(pika.BlockingConnection(parameters)) as connection:
        channel = connection.channel()
        live_queues = [q for q in topology.queues if _queue_exists(connection, q)]
        for queue in live_queues:
            if topology.queue_types.get(queue) == "stream":
                bodies = _read_stream(connection, queue)
            else:
                bodies = _get_all(channel, queue)
            for body in bodies:
                msg_id = body.decode()
                if msg_id not in reached:
                    raise AssertionError(f"unknown delivery {body!r} on {queue}")
                if queue in reached[msg_id]:
                    raise AssertionError(f"{msg_id} reached {queue} twice")
                reached[msg_id].add(queue)
    return {k: frozenset(v) for k, v in reached.items()}


def _get_all(channel: Any, queue: str) -> Iterator[bytes]:
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return
        yield body


#: Published last to a stream so its reader knows it has read everything
#: (a stream has no "empty"; its passive declare reports 0 messages).
_END_OF_STREAM = b"\x00end-of-stream"


def _read_stream(connection: Any, queue: str) -> list[bytes]:
    """Every message of a stream, from its first offset (streams are not drained)."""
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", queue, _END_OF_STREAM)
    channel.basic_qos(prefetch_count=200)  # a stream consumer needs a prefetch
    bodies: list[bytes] = []
    for method, _props, body in channel.consume(
        queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=30
    ):
        if method is None:
            raise AssertionError(f"stream {queue}: end marker not read within 30 s")
        channel.basic_ack(method.delivery_tag)
        if body == _END_OF_STREAM:
            break
        bodies.append(body)
    channel.cancel()
    channel.close()
    return bodies


def live_queues(url: str, topology: Topology) -> list[str]:
    """The queues of ``topology`` that exist now."""
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as connection:
        return [q for q in topology.queues if _queue_exists(connection, q)]


def _queue_exists(connection: Any, queue: str) -> bool:
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    channel.close()
    return True


def predicted_routes(
    table: RoutingTable, vhost: str, messages: Sequence[Message]
) -> dict[str, frozenset[str]]:
    """What ``table`` says about each message."""
    return {m.id: table.route(vhost, m.exchange, m.routing_key, m.headers) for m in messages}


def differences(
    messages: Sequence[Message],
    observed: Mapping[str, frozenset[str]],
    predicted: Mapping[str, frozenset[str]],
) -> list[str]:
    """Human-readable lines for every message where prediction and reality differ."""
    return [
        f"{m}: broker {sorted(observed[m.id])} table {sorted(predicted[m.id])}"
        for m in messages
        if observed[m.id] != predicted[m.id]
    ]


def declare_on_broker(channel: Any, topology: Topology) -> None:
    """Carry out ``topology``'s recorded declarations through a pika channel."""
    for op, args, kwargs in topology.operations:
        if op == "declare_exchange":
            name, type_, arguments = args
            channel.exchange_declare(
                name, type_, internal=bool(kwargs.get("internal")), arguments=arguments
            )
        elif op == "declare_queue":
            channel.queue_declare(args[0], arguments=args[1] if len(args) > 1 else None)
        elif op == "bind_queue":
            queue, source, key, *rest = args
            channel.queue_bind(queue, source, key, arguments=rest[0] if rest else None)
        elif op == "bind_exchange":
            destination, source, key, *rest = args
            channel.exchange_bind(destination, source, key, arguments=rest[0] if rest else None)
        else:
            raise ValueError(f"declare_on_broker does not handle {op}")
