"""Depth accounting, delivery tags and reconciliation."""

from __future__ import annotations

from rabbitflow_broker.depth import ChannelDeliveries, Delivery, DepthTracker

KEY = ("/", "q")


def test_publish_adds_message_and_bytes() -> None:
    depth = DepthTracker()
    got = depth.add(KEY, 1, 10, now=0.0)
    assert (got.messages, got.bytes) == (1, 10)


def test_removal_never_goes_negative() -> None:
    depth = DepthTracker()
    got = depth.add(KEY, -1, -10, now=0.0)
    assert (got.messages, got.bytes) == (0, 0)


def test_purge_shrinks_bytes_in_proportion() -> None:
    depth = DepthTracker()
    depth.add(KEY, 4, 400, now=0.0)
    got = depth.purge(KEY, 3, now=0.0)
    assert (got.messages, got.bytes) == (1, 100)


def test_reconcile_adopts_count_when_quiet() -> None:
    depth = DepthTracker()
    depth.add(KEY, 5, 50, now=0.0)
    seen = depth.version(KEY)
    got = depth.reconcile(KEY, messages=2, size=None, seen_version=seen, now=10.0, settle=1.0)
    assert got is not None
    assert (got.messages, got.bytes) == (2, 20)


def test_reconcile_skips_queue_changed_since_request() -> None:
    depth = DepthTracker()
    seen = depth.version(KEY)
    depth.add(KEY, 5, 50, now=0.0)
    assert depth.reconcile(KEY, messages=0, size=0, seen_version=seen, now=10.0, settle=1.0) is None
    assert depth.get(KEY).messages == 5


def test_reconcile_skips_queue_changed_within_settle_time() -> None:
    depth = DepthTracker()
    depth.add(KEY, 5, 50, now=9.5)
    seen = depth.version(KEY)
    assert depth.reconcile(KEY, messages=0, size=0, seen_version=seen, now=10.0, settle=1.0) is None


def test_reconcile_to_zero_messages_zeroes_bytes() -> None:
    depth = DepthTracker()
    depth.add(KEY, 5, 50, now=0.0)
    got = depth.reconcile(
        KEY, messages=0, size=None, seen_version=depth.version(KEY), now=10.0, settle=1.0
    )
    assert got is not None
    assert got.bytes == 0


def test_ack_settles_one_delivery() -> None:
    deliveries = ChannelDeliveries()
    deliveries.delivered(1, "q", 10)
    deliveries.delivered(2, "q", 20)
    assert deliveries.settle(2, multiple=False) == [Delivery("q", 20)]
    assert len(deliveries) == 1


def test_multiple_ack_settles_prefix() -> None:
    deliveries = ChannelDeliveries()
    for tag in (1, 2, 3):
        deliveries.delivered(tag, "q", tag)
    assert deliveries.settle(2, multiple=True) == [Delivery("q", 1), Delivery("q", 2)]
    assert len(deliveries) == 1


def test_multiple_zero_settles_everything() -> None:
    deliveries = ChannelDeliveries()
    deliveries.delivered(1, "a", 1)
    deliveries.delivered(2, "b", 2)
    assert len(deliveries.settle(0, multiple=True)) == 2


def test_unknown_tag_settles_nothing() -> None:
    assert ChannelDeliveries().settle(9, multiple=False) == []


def test_requeue_forgets_deliveries() -> None:
    deliveries = ChannelDeliveries()
    deliveries.delivered(1, "q", 1)
    deliveries.requeue_all()
    assert len(deliveries) == 0
