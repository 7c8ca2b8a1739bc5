"""SDK round trips against the real RabbitMQ: the parts of SPEC §2 that the
flow-control tests in integration/client do not exercise."""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.request
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest

import rabbitflow

from ..conftest import Broker


@pytest.fixture
def connection(broker: Broker) -> Iterator[rabbitflow.Connection]:
    with rabbitflow.ConnectionFactory(broker.url).create_connection() as conn:
        conn.start()
        yield conn


@pytest.fixture
def exchanges(broker: Broker) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    conn = broker.blocking_connection()
    try:
        for name in names:
            with contextlib.suppress(Exception):
                conn.channel().exchange_delete(name)
    finally:
        conn.close()


def test_text_message_round_trip_keeps_headers_and_properties(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    session = connection.create_session()
    queue = session.create_queue(unique_name("rt"))
    cleanup_queues.append(queue.name)
    message = session.create_text_message("héllo")
    message.set_property("region", "eu")
    message.set_property("attempt", 3)
    message.correlation_id = "c-1"
    with session.create_producer(queue) as producer:
        producer.send(message, priority=6)
    received = session.create_consumer(queue).receive(timeout=10)
    assert isinstance(received, rabbitflow.TextMessage)
    assert received.text == "héllo"
    assert received.properties == {"region": "eu", "attempt": 3}
    assert (received.message_id, received.correlation_id, received.priority) == (
        message.message_id,
        "c-1",
        6,
    )


def test_receive_times_out_with_none(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    session = connection.create_session()
    queue = session.create_queue(unique_name("empty"))
    cleanup_queues.append(queue.name)
    assert session.create_consumer(queue).receive(timeout=0.3) is None


def test_existing_queue_is_used_with_its_arguments(
    broker: Broker,
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    name = unique_name("args")
    cleanup_queues.append(name)
    pika_connection = broker.blocking_connection()
    pika_connection.channel().queue_declare(name, durable=True, arguments={"x-max-length": 5})
    pika_connection.close()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue(name), capacity=10)
    for n in range(7):
        producer.send(session.create_text_message(str(n)))
    producer.close()
    # The SDK neither redeclared the queue nor changed its arguments ...
    assert _queue_arguments(broker, name) == {"x-max-length": 5}
    # ... and they are in force: RabbitMQ dropped the two oldest of seven.
    pika_connection = broker.blocking_connection()
    try:
        channel = pika_connection.channel()
        assert channel.queue_declare(name, passive=True).method.message_count == 5
        bodies = [channel.basic_get(name, auto_ack=True)[2] for _ in range(5)]
    finally:
        pika_connection.close()
    assert bodies == [str(n).encode() for n in range(2, 7)]


def _queue_arguments(broker: Broker, name: str) -> object:
    """The queue's arguments as RabbitMQ's management API lists them."""
    base = (broker.management_url or "http://127.0.0.1:15672").rstrip("/")
    request = urllib.request.Request(
        f"{base}/api/queues/%2F/{quote(name, safe='')}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["arguments"]


def test_topic_subscribers_each_get_a_copy(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    exchanges: list[str],
) -> None:
    session = connection.create_session()
    topic = session.create_topic(unique_name("t"))
    exchanges.append(topic.name)
    first, second = session.create_consumer(topic), session.create_consumer(topic)
    with session.create_producer(topic) as producer:
        producer.send(session.create_text_message("tick"))
    for consumer in (first, second):
        message = consumer.receive(timeout=10)
        assert message is not None
        assert isinstance(message, rabbitflow.TextMessage)
        assert message.text == "tick"


def test_durable_subscription_keeps_messages_while_closed(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    exchanges: list[str],
    cleanup_queues: list[str],
) -> None:
    session = connection.create_session()
    topic = session.create_topic(unique_name("dt"))
    exchanges.append(topic.name)
    name = unique_name("sub")
    cleanup_queues.append(name)
    session.create_durable_subscriber(topic, name).close()
    with session.create_producer(topic) as producer:
        producer.send(session.create_text_message("kept"))
    message = session.create_durable_subscriber(topic, name).receive(timeout=10)
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "kept"


def test_rolled_back_send_is_not_delivered_and_committed_one_is(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    tx = connection.create_session(transacted=True)
    queue = tx.create_queue(unique_name("tx"))
    cleanup_queues.append(queue.name)
    producer = tx.create_producer(queue)
    producer.send(tx.create_text_message("discarded"))
    tx.rollback()
    producer.send(tx.create_text_message("committed"))
    tx.commit()
    reader = connection.create_session().create_consumer(queue)
    message = reader.receive(timeout=10)
    assert isinstance(message, rabbitflow.TextMessage)
    assert message.text == "committed"
    assert reader.receive(timeout=0.5) is None


def test_transacted_receive_is_redelivered_after_rollback(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    plain = connection.create_session()
    queue = plain.create_queue(unique_name("txr"))
    cleanup_queues.append(queue.name)
    with plain.create_producer(queue) as producer:
        producer.send(plain.create_text_message("once"))
    tx = connection.create_session(transacted=True)
    consumer = tx.create_consumer(queue)
    assert consumer.receive(timeout=10) is not None
    tx.rollback()
    again = consumer.receive(timeout=10)
    assert again is not None
    assert again.redelivered
    tx.commit()
    assert consumer.receive(timeout=0.5) is None


def test_client_acknowledge_recover_redelivers_unacknowledged(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    session = connection.create_session(acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE)
    queue = session.create_queue(unique_name("ca"))
    cleanup_queues.append(queue.name)
    with session.create_producer(queue) as producer:
        for text in ("a", "b"):
            producer.send(session.create_text_message(text))
    consumer = session.create_consumer(queue)
    first = consumer.receive(timeout=10)
    assert first is not None
    first.acknowledge()
    second = consumer.receive(timeout=10)
    assert isinstance(second, rabbitflow.TextMessage)
    session.recover()
    redelivered = consumer.receive(timeout=10)
    assert isinstance(redelivered, rabbitflow.TextMessage)
    assert (redelivered.text, redelivered.redelivered) == ("b", True)
    redelivered.acknowledge()
    assert consumer.receive(timeout=0.5) is None


def test_listener_receives_every_message_in_order(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    import threading

    session = connection.create_session()
    queue = session.create_queue(unique_name("ls"))
    cleanup_queues.append(queue.name)
    got: list[str] = []
    done = threading.Event()

    def on_message(message: rabbitflow.Message) -> None:
        assert isinstance(message, rabbitflow.TextMessage)
        got.append(message.text)
        if len(got) == 50:
            done.set()

    session.create_consumer(queue).set_message_listener(on_message)
    with session.create_producer(queue) as producer:
        for n in range(50):
            producer.send(session.create_text_message(str(n)))
    assert done.wait(20), f"listener got {len(got)} of 50"
    assert got == [str(n) for n in range(50)]


def test_several_threads_share_one_producer(
    connection: rabbitflow.Connection,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    import threading

    session = connection.create_session()
    queue = session.create_queue(unique_name("mt"))
    cleanup_queues.append(queue.name)
    producer = session.create_producer(queue, capacity=10)
    errors: list[BaseException] = []

    def send_all(thread: int) -> None:
        try:
            for n in range(200):
                producer.send(session.create_text_message(f"{thread}:{n}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send_all, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    producer.close()
    assert errors == []
    consumer = session.create_consumer(queue)
    texts = []
    while (message := consumer.receive(timeout=2)) is not None:
        assert isinstance(message, rabbitflow.TextMessage)
        texts.append(message.text)
    assert len(texts) == 800
    for thread in range(4):
        mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{thread}:")]
        assert mine == list(range(200))
