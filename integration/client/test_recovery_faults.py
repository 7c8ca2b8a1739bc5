"""Recovery under fault injection: a proxy cuts the connection at chosen
frames (after N publishes; at the k-th Channel.Open of a reconnection; at
the first publish of a reconnection; twice and three times in a row) while
several sessions of one connection send to the real RabbitMQ (directly,
and for the hardest plans through the gateway: the proxy then sits between
the client and the gateway).

Every message ``send()`` accepted must arrive (a re-sent unconfirmed message
may arrive twice), in order per producer, with no flow-control warning, no
timeout, and a ``close()`` that confirms everything.  A consumer, in each
acknowledge mode, receives nothing its dead channel had buffered once the
loss is seen, and ``acknowledge()`` of a message of a dead channel raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

import rabbitflow

from ..conftest import Broker
from ._faults import Cut, FaultProxy
from ._support import CLIENT_LOGGER, declare_queue, drain, numbers, publish_bodies, wait_until

SESSIONS = 3
MESSAGES = 1500  # per producer (4,500 on the connection: past every plan's cuts)
RECOVERY = {
    "rabbitflow.reconnect_initial_delay": 50,
    "rabbitflow.reconnect_max_delay": 500,
    "qpid.flow_control_wait_notify_period": 1000,
}

PLANS = {
    "after-publishes": [Cut.after_publishes(2000)],
    "at-3rd-channel-open-of-reconnection": [Cut.after_publishes(2000), Cut.at_channel_open(3)],
    "at-4th-channel-open-of-reconnection": [Cut.after_publishes(2000), Cut.at_channel_open(4)],
    "at-first-publish-of-reconnection": [Cut.after_publishes(2000), Cut.after_publishes(0)],
    "twice-in-a-row": [Cut.after_publishes(1500), Cut.at_channel_open(5), Cut.after_publishes(0)],
    "three-times-in-a-row": [
        Cut.after_publishes(1000),
        Cut.after_publishes(0),
        Cut.at_channel_open(2),
        Cut.after_publishes(300),
    ],
}


@pytest.fixture
def queues(broker: Broker, new_queue: Callable[[str], str]) -> list[str]:
    names = [new_queue(f"fault{n}") for n in range(SESSIONS)]
    for name in names:
        declare_queue(broker.url, name)
    return names


def _in_order_once_each(received: list[int], count: int) -> bool:
    """Every number 1..count arrived, and their first arrivals are in order
    (a re-sent message may also arrive a second time)."""
    first: list[int] = []
    seen: set[int] = set()
    for n in received:
        if n not in seen:
            seen.add(n)
            first.append(n)
    return first == list(range(1, count + 1))


THROUGH_GATEWAY = ("twice-in-a-row", "three-times-in-a-row")


@pytest.fixture
def target(broker: Broker, path: str, request: pytest.FixtureRequest) -> tuple[str, int]:
    """Where the fault proxy relays to: RabbitMQ, or a gateway in front of it."""
    if path == "direct":
        return broker.host, broker.port
    gateway = urlsplit(request.getfixturevalue("gateway_url"))
    assert gateway.hostname is not None
    assert gateway.port is not None
    return gateway.hostname, gateway.port


@pytest.mark.slow  # 9,000 messages through the fault proxy per plan
@pytest.mark.parametrize(
    ("plan", "path"),
    [(plan, "direct") for plan in PLANS] + [(plan, "gateway") for plan in THROUGH_GATEWAY],
    ids=[*PLANS, *(f"{plan}-through-the-gateway" for plan in THROUGH_GATEWAY)],
)
def test_every_accepted_send_arrives_in_order_across_cuts(
    broker: Broker,
    queues: list[str],
    target: tuple[str, int],
    plan: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    cuts = PLANS[plan]
    errors: list[BaseException] = []
    with FaultProxy(target, cuts) as proxy:
        factory = rabbitflow.ConnectionFactory(proxy.url(), properties=RECOVERY)
        connection = factory.create_connection()
        sessions = [connection.create_session() for _ in queues]
        producers = [
            s.create_producer(s.create_queue(q), capacity=100)
            for s, q in zip(sessions, queues, strict=True)
        ]

        def send_all(session: rabbitflow.Session, producer: rabbitflow.MessageProducer) -> None:
            try:
                for n in range(1, MESSAGES + 1):
                    producer.send(session.create_text_message(str(n)))
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=send_all, args=pair)
            for pair in zip(sessions, producers, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert all(p.sent_count == MESSAGES for p in producers)
        connection.close()  # raises if any accepted message stayed unconfirmed
        assert proxy.cuts == len(cuts), f"only {proxy.cuts} of {len(cuts)} cuts happened"
    for queue in queues:
        received = numbers(drain(broker.url, queue))
        assert _in_order_once_each(received, MESSAGES), (queue, len(received))
    waits = [
        r for r in caplog.records if r.__dict__.get("flow_event") in ("send_delayed", "send_failed")
    ]
    assert waits == [], [r.getMessage() for r in waits]


@pytest.fixture
def loaded_queue(broker: Broker, new_queue: Callable[[str], str]) -> str:
    name = new_queue("faultc")
    declare_queue(broker.url, name)
    publish_bodies(broker.url, name, (str(n).encode() for n in range(1, 501)))
    return name


@pytest.mark.parametrize(
    "mode",
    [rabbitflow.AUTO_ACKNOWLEDGE, rabbitflow.CLIENT_ACKNOWLEDGE, rabbitflow.DUPS_OK_ACKNOWLEDGE],
    ids=["auto", "client", "dups-ok"],
)
def test_a_consumer_receives_nothing_from_a_dead_channel(
    broker: Broker, loaded_queue: str, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CLIENT_LOGGER)
    with FaultProxy((broker.host, broker.port)) as proxy:
        factory = rabbitflow.ConnectionFactory(
            proxy.url(), properties={**RECOVERY, "imqConsumerFlowLimit": 200}
        )
        with factory.create_connection() as connection:
            session = connection.create_session(acknowledge_mode=mode)
            consumer = session.create_consumer(session.create_queue(loaded_queue))
            connection.start()
            before = [consumer.receive(timeout=10) for _ in range(10)]
            assert all(m is not None for m in before)
            wait_until(lambda: consumer.buffered_count >= 150, 10, "a full buffer")
            delivered_on_dead = proxy.connections[0].deliveries
            proxy.cut_all()
            wait_until(
                lambda: any("Connection lost" in r.getMessage() for r in caplog.records),
                10,
                "the SDK to see the loss",
            )
            after: list[rabbitflow.Message] = []
            seen = {_number(m) for m in before if m is not None}
            while len(seen) < 500:
                message = consumer.receive(timeout=15)
                assert message is not None, f"{len(seen)} of 500"
                after.append(message)
                seen.add(_number(message))
                if mode == rabbitflow.CLIENT_ACKNOWLEDGE:
                    message.acknowledge()
            if mode == rabbitflow.CLIENT_ACKNOWLEDGE:
                stale = before[0]
                assert stale is not None
                with pytest.raises(rabbitflow.StaleMessageError):
                    stale.acknowledge()
    # A message the dead channel delivered can only come again as a redelivery
    # on the new channel, never from the dead channel's buffer.
    from_dead = [_number(m) for m in after if _number(m) <= delivered_on_dead and not m.redelivered]
    assert from_dead == []


def _number(message: rabbitflow.Message) -> int:
    return int(message.body_bytes())
