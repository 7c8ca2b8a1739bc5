"""Issue 4 item 1: the per-vhost store quota blocks and frees every producer."""

from __future__ import annotations

import gc
from collections.abc import Callable
from urllib.parse import quote

import pytest

from integration.broker_ops._clients import Drainer, SdkProducer
from integration.broker_ops.conftest import RunningGateway, wait_for
from rabbitflow_broker.events import ALL_QUEUES

OVERFULL, UNDERFULL = 1_000_000, 512_000


@pytest.mark.slow
def test_store_quota_blocks_both_producers_and_draining_frees_them(
    gateway_factory: Callable[..., RunningGateway], fresh_vhost: str
) -> None:
    # No default queue thresholds: only the store quota may block here.
    gateway = gateway_factory(
        store_overfull_size=OVERFULL,
        store_underfull_size=UNDERFULL,
        store_poll_interval=500,
        default_queue_limit=0,
    )
    service = gateway.service
    assert service is not None
    url = f"amqp://guest:guest@127.0.0.1:{gateway.port}/{quote(fresh_vhost, safe='')}"
    queues = {"a": f"store-a-{fresh_vhost}", "b": f"store-b-{fresh_vhost}"}
    setup = Drainer(url, [])
    for queue in queues.values():
        setup.channel.queue_declare(queue, durable=True)
    setup.close()

    producers = [SdkProducer(url, queue, pid=pid) for pid, queue in queues.items()]
    for producer in producers:
        producer.start()
    try:
        # Other vhosts (the shared "/") may cross the quota too: only ours counts.
        def store_events(code: str) -> list[dict[str, object]]:
            return [e for e in gateway.events(code) if e["vhost"] == fresh_vhost]

        overfull = wait_for(
            lambda: store_events("MST-1008"),
            timeout=60,
            what="MST-1008 once the vhost store passed 1 MB",
        )
        assert overfull[0]["vhost"] == fresh_vhost
        size = overfull[0]["size"]
        assert isinstance(size, int)
        assert size > OVERFULL
        print(f"MST-1008 at store size {size:,} bytes (quota {OVERFULL:,})")

        def flowed() -> list[object]:
            channels = gateway.call(service.gateway.blocked_channels)
            mine = [c for c in channels if c.vhost == fresh_vhost]
            return mine if len(mine) == 2 and all(ALL_QUEUES in c.blocked_on for c in mine) else []

        wait_for(flowed, timeout=30, what="both producers' channels flowed on ** All Queues **")
        enforced = [e for e in gateway.events("CHN-1005") if e["vhost"] == fresh_vhost]
        assert [e["queue"] for e in enforced] == [ALL_QUEUES, ALL_QUEUES]
        assert len({(e["connection"], e["channel"]) for e in enforced}) == 2
        assert len(store_events("MST-1008")) == 1
        snapshot = gateway.call(service.gateway.store_quotas.snapshots)
        mine = [s for s in snapshot if s.vhost == fresh_vhost]
        assert mine
        assert mine[0].overfull
        assert mine[0].overfull_count == 1

        sent_when_blocked = {p.pid: p.sent for p in producers}
        drainer = Drainer(url, queues.values())
        drainer.until(
            lambda: bool(store_events("MST-1009")), timeout=90, what="MST-1009 below 512 KB"
        )
        cleared = store_events("MST-1009")
        assert cleared[0]["vhost"] == fresh_vhost
        assert isinstance(cleared[0]["size"], int)
        assert cleared[0]["size"] < UNDERFULL
        drainer.until(
            lambda: all(p.sent > sent_when_blocked[p.pid] + 5 for p in producers),
            timeout=60,
            what="both producers sending again",
        )
        removed = [e for e in gateway.events("CHN-1006") if e["vhost"] == fresh_vhost]
        assert len({(e["connection"], e["channel"]) for e in removed}) == 2
    finally:
        for producer in producers:
            producer.halt.set()
    for producer in producers:
        assert producer.done.wait(60), f"producer {producer.pid} did not finish"
        assert producer.error is None, producer.error
    drainer.until(
        lambda: all(len(drainer.received.get(p.pid, [])) >= p.sent for p in producers),
        timeout=90,
        what="every sent message drained",
    )
    drainer.close()
    for producer in producers:
        assert drainer.received[producer.pid] == list(range(producer.sent)), producer.pid
    gc.collect()
