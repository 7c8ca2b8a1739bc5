"""Readings from a passive declare's ready count (pure): when the
unacknowledged part from the last listing may be added, and when not."""

from __future__ import annotations

from rabbitflow_broker.hub.depth_sources import (
    DECLARE_SETTLE_S,
    DepthSources,
    QueueType,
)

KEY = ("/", "orders")


def _sources(
    kind: QueueType, *, ready: int | None, unacked: int | None, listed: bool = True
) -> DepthSources:
    sources = DepthSources(interval=1.0)
    if listed:
        parts = (ready, unacked)
        sources.readings(
            KEY,
            kind,
            totals=None if ready is None else ready + (unacked or 0),
            stats=None,
            seen_version=0,
            totals_parts=parts,
            stats_parts=parts,
        )
    return sources


def test_ready_plus_the_listed_unacked_is_the_reading_of_a_classic_queue() -> None:
    sources = _sources(QueueType.CLASSIC, ready=0, unacked=7)
    reading = sources.declared(KEY, ready=0, consumers=1, elapsed=0.01, now=10.0)
    assert reading is not None
    assert (reading.messages, reading.size, reading.settle) == (7, None, DECLARE_SETTLE_S)


def test_an_unlisted_queue_gives_no_reading() -> None:
    sources = _sources(QueueType.CLASSIC, ready=0, unacked=0, listed=False)
    assert sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.0) is None


def test_with_consumers_a_ready_count_that_moved_since_the_listing_is_not_taken() -> None:
    # 150 ready when listed; now 0 with a consumer: they may all be unacked.
    sources = _sources(QueueType.CLASSIC, ready=150, unacked=0)
    assert sources.declared(KEY, ready=0, consumers=1, elapsed=0.01, now=10.0) is None


def test_without_consumers_a_fallen_ready_count_is_taken() -> None:
    sources = _sources(QueueType.CLASSIC, ready=150, unacked=0)
    reading = sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.0)
    assert reading is not None
    assert reading.messages == 0


def test_gateway_held_deliveries_leave_the_queue_to_the_gateways_count_for_a_while() -> None:
    sources = _sources(QueueType.CLASSIC, ready=0, unacked=5)
    sources.gateway_unacked({KEY: 5}, now=10.0)
    assert sources.declared(KEY, ready=0, consumers=1, elapsed=0.01, now=10.5) is None
    # Past two listings after the last time they were held: taken again.
    assert sources.declared(KEY, ready=0, consumers=1, elapsed=0.01, now=12.5) is not None


def test_a_quorum_empty_answer_needs_two_fast_answers_in_a_row() -> None:
    sources = _sources(QueueType.QUORUM, ready=150, unacked=0)
    assert sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.0) is None
    reading = sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.25)
    assert reading is not None
    assert reading.messages == 0


def test_a_slow_quorum_empty_answer_may_be_a_timed_out_leader_query() -> None:
    sources = _sources(QueueType.QUORUM, ready=150, unacked=0)
    assert sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.0) is None
    # RabbitMQ answers 0/0 when its 250 ms leader query times out.
    assert sources.declared(KEY, ready=0, consumers=0, elapsed=0.3, now=10.25) is None
    assert sources.declared(KEY, ready=0, consumers=0, elapsed=0.01, now=10.5) is None


def test_a_new_quorum_queue_counts_no_unacked_only_without_consumers() -> None:
    sources = _sources(QueueType.QUORUM, ready=None, unacked=None)
    assert sources.declared(KEY, ready=40, consumers=1, elapsed=0.01, now=10.0) is None
    reading = sources.declared(KEY, ready=40, consumers=0, elapsed=0.01, now=10.0)
    assert reading is not None
    assert reading.messages == 40


def test_a_classic_queue_without_a_listed_unacked_count_gives_no_reading() -> None:
    sources = _sources(QueueType.CLASSIC, ready=None, unacked=None)
    assert sources.declared(KEY, ready=40, consumers=0, elapsed=0.01, now=10.0) is None


def test_streams_are_never_read_by_declare() -> None:
    sources = _sources(QueueType.STREAM, ready=10, unacked=0)
    assert sources.declared(KEY, ready=10, consumers=0, elapsed=0.01, now=10.0) is None
