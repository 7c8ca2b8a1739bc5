"""Depth accounting, delivery tags and reconciliation."""

from __future__ import annotations

import pytest

from rabbitflow_broker.engine.depth import ChannelDeliveries, Delivery, DepthTracker
from rabbitflow_broker.hub.depth_sources import DepthSources, QueueType, Reading, queue_type

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


# -- depth sources per queue type ------------------------------------------------

KEY = ("/", "q")


def _sources() -> DepthSources:
    return DepthSources(interval=1.0, stats_settle=12.0)


@pytest.mark.parametrize(
    ("arguments", "listed", "kind"),
    [
        ({}, "quorum", QueueType.QUORUM),
        ({"x-queue-type": "stream"}, None, QueueType.STREAM),
        ({"x-queue-type": b"quorum"}, None, QueueType.QUORUM),
        (None, None, QueueType.CLASSIC),
        ({}, "some-future-type", QueueType.CLASSIC),
    ],
)
def test_queue_type_comes_from_the_listing_else_the_arguments(
    arguments: dict[str, object] | None, listed: object, kind: QueueType
) -> None:
    assert queue_type(arguments, listed) is kind


@pytest.mark.parametrize("totals", [0, None])
def test_quorum_count_from_the_totals_listing_is_never_adopted(totals: object) -> None:
    sources = _sources()
    for _ in range(5):
        got = sources.readings(
            KEY, QueueType.QUORUM, totals=totals, stats=None, seen_version=3, initial=True
        )
        assert got == []


def test_quorum_count_from_the_statistics_is_adopted_after_a_second_report() -> None:
    sources = _sources()
    poll = {"totals": 0, "stats": (150, 1500), "seen_version": 3}
    assert sources.readings(KEY, QueueType.QUORUM, **poll) == []  # type: ignore[arg-type]
    assert sources.readings(KEY, QueueType.QUORUM, **poll) == [  # type: ignore[arg-type]
        Reading(150, 1500, 12.0, "statistics")
    ]


def test_stream_count_comes_from_the_statistics_like_a_quorum_queue() -> None:
    sources = _sources()
    got = sources.readings(
        KEY, QueueType.STREAM, totals=0, stats=(7, 70), seen_version=0, initial=True
    )
    assert got == [Reading(7, 70, 12.0, "statistics")]


def test_gateway_change_between_reports_defers_adoption() -> None:
    sources = _sources()
    sources.readings(KEY, QueueType.QUORUM, totals=None, stats=(5, 50), seen_version=1)
    got = sources.readings(KEY, QueueType.QUORUM, totals=None, stats=(5, 50), seen_version=2)
    assert got == []


def test_classic_totals_are_adopted_after_one_interval_and_bytes_after_the_settle() -> None:
    sources = _sources()
    assert sources.readings(KEY, QueueType.CLASSIC, totals=4, stats=(4, 40), seen_version=0) == []
    got = sources.readings(KEY, QueueType.CLASSIC, totals=4, stats=(4, 40), seen_version=0)
    assert got == [Reading(4, None, 1.0, "totals"), Reading(4, 40, 12.0, "statistics")]


def test_classic_bytes_are_not_taken_from_statistics_of_another_count() -> None:
    sources = _sources()
    got = sources.readings(
        KEY, QueueType.CLASSIC, totals=4, stats=(3, 30), seen_version=0, initial=True
    )
    assert got == [Reading(4, None, 1.0, "totals")]
