"""``GET /metrics`` against a real gateway with traffic (issue 4, point 4)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pika
from prometheus_client.parser import text_string_to_metric_families

from integration.broker.conftest import RunningGateway, wait_for


def _metrics(gateway: RunningGateway) -> dict[tuple[str, str], dict[str, float]]:
    url = f"http://127.0.0.1:{gateway.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    per_queue: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "queue" in sample.labels:
                key = (sample.labels["vhost"], sample.labels["queue"])
                per_queue.setdefault(key, {})[sample.name] = sample.value
    return per_queue


def _expected(queue: dict[str, Any]) -> dict[str, float]:
    return {
        "rabbitflow_queue_messages": queue["messages"],
        "rabbitflow_queue_bytes": queue["bytes"],
        "rabbitflow_queue_flow_stop_count": queue["flowStopCount"],
        "rabbitflow_queue_flow_resume_count": queue["flowResumeCount"],
        "rabbitflow_queue_flow_stop_size_bytes": queue["flowStopSize"],
        "rabbitflow_queue_flow_resume_size_bytes": queue["flowResumeSize"],
        "rabbitflow_queue_flow_stopped": 1 if queue["flowStopped"] else 0,
        "rabbitflow_queue_flow_stops_total": queue["flowStoppedCount"],
    }


def test_metrics_match_the_admin_api_for_a_queue_with_traffic(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    gateway = gateway_factory()
    name = unique_name("metrics")
    cleanup_queues.append(name)
    connection = gateway.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(
            name, arguments={"qpid.flow_stop_count": 5, "qpid.flow_resume_count": 2}
        )
        # Without confirms nothing is held: the queue goes over its stop count.
        for i in range(8):
            channel.basic_publish("", name, b"x" * (100 + i), pika.BasicProperties())
        wait_for(
            lambda: gateway.queue(name)["messages"] == 8,
            what="8 messages counted by the gateway",
        )

        def consistent() -> tuple[dict[str, Any], dict[str, float]] | None:
            # Time spent stopped grows while the queue is ON; it is bracketed below.
            before = gateway.queue(name)
            metrics = _metrics(gateway).get(("/", name), {})
            after = gateway.queue(name)
            seconds = metrics.get("rabbitflow_queue_flow_stopped_seconds_total", -1.0)
            if not before["flowStoppedSeconds"] <= seconds <= after["flowStoppedSeconds"] + 0.001:
                return None
            before.pop("flowStoppedSeconds")
            after.pop("flowStoppedSeconds")
            return (before, metrics) if before == after else None

        compared = wait_for(consistent, what="a quiet queue to compare")
        assert compared is not None
        queue, metrics = compared
    finally:
        connection.close()

    assert queue["flowStopped"] is True
    assert queue["bytes"] == sum(100 + i for i in range(8))
    assert {k: metrics.get(k) for k in _expected(queue)} == _expected(queue)
