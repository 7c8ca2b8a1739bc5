"""A consumer keeps receiving across a broker restart (throwaway node)."""

from __future__ import annotations

import pytest

import rabbitflow

from ..conftest import Broker

TOTAL = 500


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_consumer_recovers_and_only_redelivers_flagged_messages(
    throwaway_broker: Broker,
) -> None:
    node = throwaway_broker.node
    assert node is not None
    factory = rabbitflow.ConnectionFactory(
        throwaway_broker.url, properties={"imqConsumerFlowLimit": 20}
    )
    with factory.create_connection() as connection:
        connection.start()
        session = connection.create_session()
        queue = session.create_queue("recover-me")
        with session.create_producer(queue) as producer:
            for n in range(1, TOTAL + 1):
                producer.send(session.create_text_message(str(n)))
        consumer = session.create_consumer(queue)
        seen: list[tuple[int, bool]] = []
        for _ in range(100):
            message = consumer.receive(timeout=10)
            assert isinstance(message, rabbitflow.TextMessage)
            seen.append((int(message.text), message.redelivered))
        node.stop()
        node.start()
        while (message := consumer.receive(timeout=20)) is not None:
            assert isinstance(message, rabbitflow.TextMessage)
            seen.append((int(message.text), message.redelivered))
        assert connection.reconnect_count == 1
    numbers = [n for n, _ in seen]
    assert set(numbers) == set(range(1, TOTAL + 1))
    first_time: set[int] = set()
    for n, redelivered in seen:
        if n in first_time:
            assert redelivered, f"message {n} came twice without the redelivered flag"
        first_time.add(n)
