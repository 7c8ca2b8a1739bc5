"""Issue 3 items 2, 3, 4: count-and-bytes edges, defaults, refused thresholds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from integration.broker.conftest import RunningGateway, wait_for

BOTH = {
    "qpid.flow_stop_count": 4000,
    "qpid.flow_resume_count": 3000,
    "qpid.flow_stop_size": 8000,
    "qpid.flow_resume_size": 6000,
}


def _publish(channel: BlockingChannel, queue: str, count: int, size: int) -> None:
    body = b"x" * size
    for _ in range(count):
        channel.basic_publish("", queue, body)


def _consume_and_ack(channel: BlockingChannel, queue: str, count: int) -> None:
    """Take ``count`` messages from the head of the queue and ack them in one go."""
    channel.basic_qos(prefetch_count=count)
    last = 0
    for taken, (method, _props, _body) in enumerate(
        channel.consume(queue, inactivity_timeout=10), start=1
    ):
        assert method is not None, f"only {taken - 1} of {count} deliveries arrived"
        last = method.delivery_tag
        if taken == count:
            break
    channel.basic_ack(last, multiple=True)
    channel.cancel()


def _at(gateway: RunningGateway, queue: str, messages: int, size: int) -> dict[str, Any]:
    return wait_for(
        lambda: (q := gateway.queue(queue))["messages"] == messages and q["bytes"] == size and q,
        what=f"depth {messages} messages / {size} bytes",
    )


@pytest.fixture(params=["classic", "quorum"])
def both_queue(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    request: pytest.FixtureRequest,
) -> Iterator[tuple[str, BlockingChannel]]:
    """A queue with all four thresholds set, of each type flow control covers."""
    queue = unique_name("both")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    quorum = request.param == "quorum"
    channel.queue_declare(queue, durable=quorum, arguments={**BOTH, "x-queue-type": request.param})
    yield queue, channel
    connection.close()


def test_count_over_stop_turns_flow_on(
    gateway: RunningGateway, both_queue: tuple[str, BlockingChannel]
) -> None:
    queue, channel = both_queue
    _publish(channel, queue, 4000, 1)
    assert _at(gateway, queue, 4000, 4000)["flowStopped"] is False
    _publish(channel, queue, 1, 1)
    assert _at(gateway, queue, 4001, 4001)["flowStopped"] is True


def test_bytes_over_stop_turns_flow_on(
    gateway: RunningGateway, both_queue: tuple[str, BlockingChannel]
) -> None:
    queue, channel = both_queue
    _publish(channel, queue, 8, 1000)
    assert _at(gateway, queue, 8, 8000)["flowStopped"] is False
    _publish(channel, queue, 1, 1)
    assert _at(gateway, queue, 9, 8001)["flowStopped"] is True


def test_bytes_below_resume_is_not_enough_while_count_is_not(
    gateway: RunningGateway, both_queue: tuple[str, BlockingChannel]
) -> None:
    queue, channel = both_queue
    _publish(channel, queue, 5, 1000)  # big ones first: consumed first
    _publish(channel, queue, 3500, 1)
    assert _at(gateway, queue, 3505, 8500)["flowStopped"] is True
    _consume_and_ack(channel, queue, 5)
    still = _at(gateway, queue, 3500, 3500)
    assert still["flowStopped"] is True  # bytes 3,500 < 6,000 but 3,500 messages >= 3,000
    _consume_and_ack(channel, queue, 500)
    assert _at(gateway, queue, 3000, 3000)["flowStopped"] is True  # not below 3,000 yet
    _consume_and_ack(channel, queue, 1)
    assert _at(gateway, queue, 2999, 2999)["flowStopped"] is False


def test_count_below_resume_is_not_enough_while_bytes_are_not(
    gateway: RunningGateway, both_queue: tuple[str, BlockingChannel]
) -> None:
    queue, channel = both_queue
    _publish(channel, queue, 3994, 1)  # small ones first: consumed first
    _publish(channel, queue, 7, 1000)
    assert _at(gateway, queue, 4001, 10994)["flowStopped"] is True
    _consume_and_ack(channel, queue, 3994)
    still = _at(gateway, queue, 7, 7000)
    assert still["flowStopped"] is True  # 7 messages < 3,000 but 7,000 bytes >= 6,000
    _consume_and_ack(channel, queue, 1)
    assert _at(gateway, queue, 6, 6000)["flowStopped"] is True  # not below 6,000 yet
    _consume_and_ack(channel, queue, 1)
    after = _at(gateway, queue, 5, 5000)
    assert after["flowStopped"] is False
    assert after["flowStoppedCount"] == 1
    assert len(gateway.events("QUE-1003", queue)) == 1
    assert len(gateway.events("QUE-1004", queue)) == 1


# -- item 3: defaults -----------------------------------------------------------


def _declared(
    gateway: RunningGateway, name: str, arguments: dict[str, Any] | None
) -> dict[str, Any]:
    connection = gateway.connect()
    connection.channel().queue_declare(name, arguments=arguments)
    connection.close()
    return gateway.queue(name)


def _thresholds(info: dict[str, Any]) -> tuple[int, int, int, int, str]:
    return (
        info["flowStopCount"],
        info["flowResumeCount"],
        info["flowStopSize"],
        info["flowResumeSize"],
        info["source"],
    )


def test_reject_publish_max_length_gives_80_70_percent(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("maxlen")
    cleanup_queues.append(name)
    info = _declared(gateway, name, {"x-max-length": 1000, "x-overflow": "reject-publish"})
    assert _thresholds(info) == (800, 700, 0, 0, "default")


def test_broker_percentages_change_the_defaults(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(default_flow_stop_threshold=90, default_flow_resume_threshold=75)
    name = unique_name("pct")
    cleanup_queues.append(name)
    info = _declared(gateway, name, {"x-max-length": 1000, "x-overflow": "reject-publish"})
    assert _thresholds(info) == (900, 750, 0, 0, "default")


@pytest.mark.parametrize(
    "arguments",
    [{"x-max-length": 1000}, {"x-max-length": 1000, "x-overflow": "drop-head"}],
    ids=["no-overflow", "drop-head"],
)
def test_drop_head_queue_gets_no_defaults(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    arguments: dict[str, Any],
) -> None:
    name = unique_name("ring")
    cleanup_queues.append(name)
    assert _thresholds(_declared(gateway, name, arguments)) == (0, 0, 0, 0, "none")


def test_both_stop_arguments_zero_disable_flow_control(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("off")
    cleanup_queues.append(name)
    info = _declared(gateway, name, {"qpid.flow_stop_count": 0, "qpid.flow_stop_size": 0})
    assert _thresholds(info) == (0, 0, 0, 0, "arguments")
    connection = gateway.connect()
    _publish(connection.channel(), name, 50, 10)
    assert _at(gateway, name, 50, 500)["flowStopped"] is False
    connection.close()


def test_queue_without_limits_uses_default_queue_limit(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory(default_queue_limit=10_000)
    name = unique_name("plain")
    cleanup_queues.append(name)
    assert _thresholds(_declared(gateway, name, None)) == (0, 0, 8000, 7000, "default")
    connection = gateway.connect()
    _publish(connection.channel(), name, 9, 1000)
    assert _at(gateway, name, 9, 9000)["flowStopped"] is True
    connection.close()


def test_max_length_bytes_gives_size_defaults(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    name = unique_name("maxbytes")
    cleanup_queues.append(name)
    info = _declared(
        gateway, name, {"x-max-length-bytes": 10_000, "x-overflow": "reject-publish-dlx"}
    )
    assert _thresholds(info) == (0, 0, 8000, 7000, "default")


# -- item 4: refused thresholds -------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"qpid.flow_stop_count": 10, "qpid.flow_resume_count": 20}, "qpid.flow_resume_count"),
        ({"qpid.flow_stop_size": -5}, "qpid.flow_stop_size"),
        ({"qpid.flow_stop_count": "100"}, "qpid.flow_stop_count"),
    ],
    ids=["resume-above-stop", "negative", "string"],
)
def test_bad_threshold_is_refused_with_406_naming_it(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    arguments: dict[str, Any],
    named: str,
) -> None:
    bystander = gateway.connect()
    other_queue = unique_name("bystander")
    cleanup_queues.append(other_queue)
    bystander_channel = bystander.channel()
    bystander_channel.queue_declare(other_queue)

    connection = gateway.connect()
    sibling = connection.channel()
    refused = connection.channel()
    name = unique_name("bad")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        refused.queue_declare(name, arguments=arguments)
    assert caught.value.reply_code == 406
    assert named in caught.value.reply_text

    # Nothing reached RabbitMQ, and everyone else carries on.
    probe = gateway.connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
        probe.channel().queue_declare(name, passive=True)
    probe.close()
    assert missing.value.reply_code == 404
    sibling.basic_publish("", other_queue, b"sibling")
    again = connection.channel()
    again.basic_publish("", other_queue, b"reopened")
    bystander_channel.basic_publish("", other_queue, b"bystander")
    got = []
    for _ in range(3):
        method, _props, body = bystander_channel.basic_get(other_queue, auto_ack=True)
        assert method is not None
        got.append(body)
    assert sorted(got) == [b"bystander", b"reopened", b"sibling"]
    connection.close()
    bystander.close()


def test_refused_channel_number_can_be_reopened_at_once(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    good = unique_name("reopen")
    cleanup_queues.append(good)
    connection = gateway.connect()
    refused = connection.channel(channel_number=7)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        refused.queue_declare(unique_name("bad"), arguments={"qpid.flow_stop_count": -1})
    reopened = connection.channel(channel_number=7)
    reopened.queue_declare(good)
    reopened.basic_publish("", good, b"after reopen")
    method, _props, body = reopened.basic_get(good, auto_ack=True)
    connection.close()
    assert method is not None
    assert body == b"after reopen"
