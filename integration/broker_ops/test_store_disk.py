"""The store quota measured on disk (``--store-path``) on a throwaway node."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from integration.broker_ops.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_broker.events import ALL_QUEUES

pytestmark = pytest.mark.slow

OVERFULL = 2_000_000
SIZE = 100_000


def test_disk_store_size_is_measured_and_crossing_it_blocks(
    throwaway_broker: Broker, tmp_path: Path
) -> None:
    assert throwaway_broker.node is not None
    data_dir = throwaway_broker.node.base / "mnesia"
    gateway = RunningGateway(
        throwaway_broker,
        tmp_path / "events.jsonl",
        store_path=str(data_dir),
        store_overfull_size=OVERFULL,
        store_underfull_size=OVERFULL // 2,
        store_poll_interval=200,
    ).start()
    try:
        service = gateway.service
        assert service is not None
        connection = gateway.connect()
        channel = connection.channel()
        channel.queue_declare("disk-quota", durable=True)
        for _ in range(30):  # 3 MB: 1.5 times the quota
            channel.basic_publish(
                "", "disk-quota", bytes(SIZE), pika.BasicProperties(delivery_mode=2)
            )
        overfull = wait_for(lambda: gateway.events("MST-1008"), what="MST-1008")
        assert overfull[0]["vhost"] == "/"

        def measured() -> object:
            (snap,) = gateway.call(service.gateway.store_quotas.snapshots)
            # Past the 200 ms window the size is the disk measurement alone.
            return snap.source == "disk" and snap.size >= 30 * SIZE and snap

        snap = wait_for(measured, what="the vhost's message store measured on disk")
        assert snap.overfull

        # The producer's next publish gets its channel flowed on every queue.
        channel.basic_publish("", "disk-quota", b"one more")

        def flowed() -> list[object]:
            connection.process_data_events(time_limit=0)
            blocked = gateway.call(service.gateway.blocked_channels)
            return [c for c in blocked if c.vhost == "/" and ALL_QUEUES in c.blocked_on]

        assert len(wait_for(flowed, what="the producer's channel flowed on ** All Queues **")) == 1
        enforced = gateway.events("CHN-1005")
        assert [e["queue"] for e in enforced] == [ALL_QUEUES]
        connection.close()
    finally:
        gateway.close_clients()
        gateway.stop()
