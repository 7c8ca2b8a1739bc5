"""``GET /metrics``: Prometheus text rendered from the gateway's state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import REGISTRY

from rabbitflow_broker.admin.metrics import metrics_registry, render
from rabbitflow_broker.hub.gateway import BlockedChannel
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import FakeConnection, Serve


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _overfull_queue(service: GatewayService) -> None:
    gateway = service.gateway
    gateway.queue_declared("/", "orders", {"qpid.flow_stop_count": 3, "qpid.flow_resume_count": 1})
    for _ in range(4):
        gateway.published("/", frozenset({"orders"}), 100)


QUEUE = (("queue", "orders"), ("vhost", "/"))


def test_queue_depth_thresholds_and_state_are_exported(
    make_service: Callable[..., GatewayService],
) -> None:
    service = make_service()
    _overfull_queue(service)

    samples = _samples(render(metrics_registry(service.gateway)).decode())

    assert samples[("rabbitflow_queue_messages", QUEUE)] == 4
    assert samples[("rabbitflow_queue_bytes", QUEUE)] == 400
    assert samples[("rabbitflow_queue_flow_stop_count", QUEUE)] == 3
    assert samples[("rabbitflow_queue_flow_resume_count", QUEUE)] == 1
    assert samples[("rabbitflow_queue_flow_stop_size_bytes", QUEUE)] == 0
    assert samples[("rabbitflow_queue_flow_resume_size_bytes", QUEUE)] == 0
    assert samples[("rabbitflow_queue_flow_stopped", QUEUE)] == 1
    assert samples[("rabbitflow_queue_flow_stops_total", QUEUE)] == 1


def test_flow_stops_counter_counts_every_off_to_on_transition(
    make_service: Callable[..., GatewayService],
) -> None:
    service = make_service()
    _overfull_queue(service)
    service.gateway.removed("/", "orders", 4, 400)
    service.gateway.published("/", frozenset({"orders"}), 100)
    for _ in range(3):
        service.gateway.published("/", frozenset({"orders"}), 100)

    samples = _samples(render(metrics_registry(service.gateway)).decode())

    assert samples[("rabbitflow_queue_flow_stops_total", QUEUE)] == 2
    assert samples[("rabbitflow_queue_flow_stopped", QUEUE)] == 1


def test_store_quota_is_exported_per_vhost(make_service: Callable[..., GatewayService]) -> None:
    service = make_service(store_overfull_size=1000, store_underfull_size=500)
    service.gateway.store_quotas.observe("/", 1500, "management")

    samples = _samples(render(metrics_registry(service.gateway)).decode())

    vhost = (("vhost", "/"),)
    assert samples[("rabbitflow_store_size_bytes", vhost)] == 1500
    assert samples[("rabbitflow_store_overfull", vhost)] == 1
    assert samples[("rabbitflow_store_overfull_size_bytes", vhost)] == 1000
    assert samples[("rabbitflow_store_underfull_size_bytes", vhost)] == 500


def test_blocked_channels_held_confirms_and_admin_stops_are_exported(
    make_service: Callable[..., GatewayService],
) -> None:
    service = make_service()
    channel = BlockedChannel(
        connection=1, channel=1, user="guest", remote="127.0.0.1:1", vhost="/", blocked_on=("q",)
    )
    service.gateway.register(FakeConnection(1, [channel, channel], held=7))
    service.gateway.stop_producers(vhost="/")

    samples = _samples(render(metrics_registry(service.gateway)).decode())

    assert samples[("rabbitflow_blocked_channels", (("vhost", "/"),))] == 2
    assert samples[("rabbitflow_held_confirms", ())] == 7
    assert samples[("rabbitflow_producers_stopped", ())] == 1


def test_metrics_registry_never_touches_the_global_registry(
    make_service: Callable[..., GatewayService],
) -> None:
    service = make_service()
    _overfull_queue(service)

    metrics_registry(service.gateway)

    assert (
        REGISTRY.get_sample_value("rabbitflow_queue_messages", {"vhost": "/", "queue": "orders"})
        is None
    )


@pytest.mark.asyncio
async def test_metrics_endpoint_serves_prometheus_text(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    _overfull_queue(service)

    async with serve(service) as client:
        response = await client.get("/metrics")
        text = await response.text()

    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert _samples(text)[("rabbitflow_queue_messages", QUEUE)] == 4
