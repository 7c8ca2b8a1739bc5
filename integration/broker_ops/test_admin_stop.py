"""Issue 4 item 2: ``rabbitflow-config stop-producers|start-producers`` block
and free a running producer, with CHN-1005/CHN-1006."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from integration.broker.conftest import with_own_store
from integration.broker_ops._clients import SdkProducer
from integration.broker_ops.conftest import RunningGateway, wait_for
from rabbitflow_broker.cli.config_cli import main as config_cli
from rabbitflow_broker.events import ALL_QUEUES

CAPACITY = 20

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(gateway_factory: Callable[..., RunningGateway], tmp_path: Path) -> RunningGateway:
    """These tests assert on every stop the gateway holds (see with_own_store)."""
    return with_own_store(gateway_factory, tmp_path)


def _cli(gateway: RunningGateway, *args: str) -> None:
    assert config_cli(["--admin-url", f"http://127.0.0.1:{gateway.admin_port}", *args]) == 0


def _blocked_on(gateway: RunningGateway, queue: str) -> list[list[str]]:
    return [
        c["blockedOn"]
        for c in gateway.channels()
        if c["flowStopped"] and c["connection"] in _connections_of(gateway, queue)
    ]


def _connections_of(gateway: RunningGateway, queue: str) -> set[int]:
    return {
        e["connection"] for e in gateway.events("CHN-1005") if e["queue"] in (queue, ALL_QUEUES)
    }


def _run_stop_start(
    gateway: RunningGateway, queue: str, stop_args: list[str], blocker: str, vhost: str = "/"
) -> None:
    url = gateway.url.rsplit("/", 1)[0] + "/" + quote(vhost, safe="")
    producer = SdkProducer(url, queue, pid="p", capacity=CAPACITY)
    producer.start()
    try:
        wait_for(lambda: producer.sent > 10, what="the producer sending")
        _cli(gateway, "stop-producers", *stop_args)
        enforced = wait_for(
            lambda: [e for e in gateway.events("CHN-1005") if e["queue"] == blocker],
            what=f"CHN-1005 naming {blocker}",
        )
        assert len(enforced) == 1
        wait_for(lambda: _blocked_on(gateway, queue) == [[blocker]], what="the channel flowed")
        # Stopped: the producer may fill its window of unconfirmed sends, no more.
        depth_at_stop = gateway.queue(queue, vhost)["messages"]
        sent_at_stop = producer.sent
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert gateway.queue(queue, vhost)["messages"] <= depth_at_stop + CAPACITY
            assert producer.sent <= sent_at_stop + CAPACITY
            time.sleep(0.05)
        assert not gateway.events("CHN-1006")

        _cli(gateway, "start-producers", *stop_args)
        wait_for(lambda: gateway.events("CHN-1006"), what="CHN-1006 after start-producers")
        wait_for(lambda: producer.sent > sent_at_stop + CAPACITY + 10, what="producer freed")
        assert _blocked_on(gateway, queue) == []
    finally:
        producer.halt.set()
    assert producer.done.wait(60)
    assert producer.error is None, producer.error
    gc.collect()


def test_stop_producers_of_a_queue_blocks_and_start_frees_a_running_producer(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    queue = unique_name("stop")
    cleanup_queues.append(queue)
    _run_stop_start(gateway, queue, ["--queue", queue], queue)
    service = gateway.service
    assert service is not None
    assert gateway.call(service.gateway.admin_stops) == []


def test_stop_producers_of_a_vhost_names_all_queues(
    gateway: RunningGateway, unique_name: Callable[[str], str], fresh_vhost: str
) -> None:
    # A vhost of its own: a stop is kept in the shared RabbitMQ while it lasts,
    # and a gateway another test starts meanwhile would restore a stop of "/".
    queue = unique_name("stopvh")  # goes with the vhost
    _run_stop_start(gateway, queue, ["--vhost", fresh_vhost], ALL_QUEUES, fresh_vhost)
