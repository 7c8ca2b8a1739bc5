"""Issue 3 items 6 and 7: held confirms for plain pika; runtime thresholds via the admin API."""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest

from integration.broker.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.persistence import RabbitMQThresholdStore


def test_plain_pika_confirm_is_held_until_queue_is_underfull(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("held")
    cleanup_queues.append(queue)
    producer = gateway.connect()
    channel = producer.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, arguments={"qpid.flow_stop_count": 5, "qpid.flow_resume_count": 3})
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    outcome: list[object] = []

    def publish_sixth() -> None:
        try:
            channel.basic_publish("", queue, b"m5")
            outcome.append("confirmed")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=publish_sixth, daemon=True)
    thread.start()
    wait_for(
        lambda: any(c["heldConfirms"] == 1 for c in gateway.channels()),
        what="the sixth confirm held by the gateway",
    )
    assert gateway.queue(queue)["flowStopped"] is True
    assert thread.is_alive()
    assert outcome == []

    consumer = gateway.connect()
    drain = consumer.channel()
    for _ in range(3):
        method, _props, _body = drain.basic_get(queue, auto_ack=True)
        assert method is not None
    assert gateway.queue(queue)["flowStopped"] is True  # 3 left: not below resume 3
    assert thread.is_alive()
    method, _props, _body = drain.basic_get(queue, auto_ack=True)
    assert method is not None
    thread.join(timeout=20)
    assert outcome == ["confirmed"]
    assert gateway.queue(queue)["flowStopped"] is False
    consumer.close()
    producer.close()


@pytest.fixture
def forget_parameter(gateway: RunningGateway) -> Iterator[list[str]]:
    """Queue names whose persisted thresholds are removed from RabbitMQ afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        parameter = RabbitMQThresholdStore.parameter_name(("/", name))
        request = urllib.request.Request(
            f"{gateway.broker.management_url}/api/global-parameters/{quote(parameter, safe='')}",
            method="DELETE",
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
        )
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=10).close()


def test_threshold_set_over_http_applies_at_once_and_survives_restart(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    forget_parameter: list[str],
) -> None:
    queue = unique_name("runtime")
    cleanup_queues.append(queue)
    forget_parameter.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    for _ in range(4):
        channel.basic_publish("", queue, b"abc")
    wait_for(lambda: gateway.queue(queue)["messages"] == 4, what="depth 4")
    assert gateway.queue(queue)["flowStopped"] is False

    status, body = gateway.http(
        "PUT", f"/api/queues/%2F/{quote(queue)}/flow", {"flowStopCount": 3, "flowResumeCount": 2}
    )
    assert status == 200, body
    assert body["flowStopped"] is True  # 4 > 3, at once
    assert body["source"] == "runtime"
    assert len(gateway.events("QUE-1003", queue)) == 1
    connection.close()

    gateway.restart()
    info = gateway.queue(queue)
    assert (info["flowStopCount"], info["flowResumeCount"], info["source"]) == (3, 2, "runtime")
    assert info["messages"] == 4
    assert info["flowStopped"] is True


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"flowStopCount": 10, "flowResumeCount": 20}, "flowResumeCount"),
        ({"flowStopSize": -1}, "flowStopSize"),
        ({"flowStopCount": "100"}, "flowStopCount"),
        ({"flowStopCount": 1.5}, "flowStopCount"),
        ({"bogus": 1}, "bogus"),
    ],
    ids=["resume-above-stop", "negative", "string", "float", "unknown"],
)
def test_bad_threshold_over_http_is_400_naming_it(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    body: dict[str, object],
    named: str,
) -> None:
    queue = unique_name("badput")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    connection.channel().queue_declare(queue)
    connection.close()
    status, answer = gateway.http("PUT", f"/api/queues/%2F/{quote(queue)}/flow", body)
    assert status == 400
    assert named in answer["error"]
    assert gateway.queue(queue)["source"] != "runtime"


def test_unknown_queue_is_404(gateway: RunningGateway, unique_name: Callable[[str], str]) -> None:
    missing = unique_name("missing")
    status, _ = gateway.http("GET", f"/api/queues/%2F/{missing}")
    assert status == 404
    status, _ = gateway.http("PUT", f"/api/queues/%2F/{missing}/flow", {"flowStopCount": 1})
    assert status == 404


def test_queue_list_shows_blocked_channels(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("listed")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    channel = connection.channel()
    channel.queue_declare(queue, arguments={"qpid.flow_stop_count": 1})
    channel.basic_publish("", queue, b"a")
    channel.basic_publish("", queue, b"b")
    listed = wait_for(
        lambda: [
            q
            for q in gateway.http("GET", "/api/queues")[1]
            if q["name"] == queue and q["blockedChannels"]
        ],
        what="queue listed with its blocked channel",
    )
    blocked = listed[0]["blockedChannels"][0]
    assert blocked["channel"] == channel.channel_number
    assert blocked["user"] == "guest"
    connection.close()


def test_tx_commit_ok_is_held_until_queue_is_underfull(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    queue = unique_name("tx")
    cleanup_queues.append(queue)
    producer = gateway.connect()
    channel = producer.channel()
    channel.queue_declare(queue, arguments={"qpid.flow_stop_count": 2, "qpid.flow_resume_count": 1})
    channel.tx_select()
    for i in range(3):
        channel.basic_publish("", queue, f"t{i}".encode())
    assert gateway.queue(queue)["messages"] == 0  # not enqueued before commit
    committed = threading.Event()

    def commit() -> None:
        channel.tx_commit()
        committed.set()

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    wait_for(
        lambda: any(c["heldCommits"] == 1 for c in gateway.channels()),
        what="commit-ok held by the gateway",
    )
    assert gateway.queue(queue)["messages"] == 3
    assert not committed.is_set()
    consumer = gateway.connect()
    drain = consumer.channel()
    for _ in range(3):
        method, _props, _body = drain.basic_get(queue, auto_ack=True)
        assert method is not None
    assert committed.wait(20), "tx.commit-ok never released"
    consumer.close()
    producer.close()


def test_consumer_on_a_blocked_channel_keeps_receiving(
    gateway: RunningGateway, unique_name: Callable[[str], str], cleanup_queues: list[str]
) -> None:
    full, other = unique_name("full"), unique_name("feed")
    cleanup_queues.extend([full, other])
    connection = gateway.connect()
    channel = connection.channel()
    channel.queue_declare(full, arguments={"qpid.flow_stop_count": 1, "qpid.flow_resume_count": 1})
    channel.queue_declare(other)
    channel.basic_publish("", full, b"1")
    channel.basic_publish("", full, b"2")
    wait_for(lambda: gateway.queue(full)["blockedChannels"], what="the publishing channel flowed")
    feeder = gateway.connect()
    feeder_channel = feeder.channel()
    feeder_channel.confirm_delivery()
    feeder_channel.basic_publish("", other, b"for the consumer")
    method, _props, body = channel.basic_get(other, auto_ack=True)
    assert method is not None
    assert body == b"for the consumer"
    feeder.close()
    connection.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_depth_catches_up_with_traffic_that_bypasses_the_gateway(
    gateway: RunningGateway,
    broker: Broker,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    queue_type: str,
) -> None:
    # A quorum queue's count comes from RabbitMQ's statistics (seconds old),
    # adopted once the gateway left the queue alone for 12 s: slower.
    queue = unique_name("bypass")
    cleanup_queues.append(queue)
    connection = gateway.connect()
    connection.channel().queue_declare(
        queue,
        durable=queue_type == "quorum",
        arguments={
            "x-queue-type": queue_type,
            "qpid.flow_stop_count": 5,
            "qpid.flow_resume_count": 2,
        },
    )
    connection.close()
    direct = broker.blocking_connection()
    direct_channel = direct.channel()
    for _ in range(8):
        direct_channel.basic_publish("", queue, b"direct")
    wait_for(
        lambda: (q := gateway.queue(queue))["messages"] == 8 and q["flowStopped"],
        timeout=60,
        what="reconciled depth 8 and flow on",
    )
    direct_channel.queue_purge(queue)
    direct.close()
    wait_for(
        lambda: (q := gateway.queue(queue))["messages"] == 0 and not q["flowStopped"],
        timeout=60,
        what="reconciled depth 0 and flow off",
    )
