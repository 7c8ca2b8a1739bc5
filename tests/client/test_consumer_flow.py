import pytest

from rabbitflow._consumer_flow import Ack, ConnectionFlow, SetPrefetch, StartConsuming


def started(limit: int | None = None) -> ConnectionFlow:
    flow = ConnectionFlow(limit)
    flow.activate()
    return flow


def deliver(flow: ConnectionFlow, consumer: int, count: int, first_tag: int = 1) -> list[int]:
    for _ in range(count):
        flow.delivered(consumer)
    return list(range(first_tag, first_tag + count))


def test_no_credit_before_the_connection_starts() -> None:
    flow = ConnectionFlow()
    assert flow.register(1, limit=10, threshold_pct=50, app_acks=False) == []


def test_start_grants_the_limit_and_starts_consuming() -> None:
    flow = ConnectionFlow()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    assert flow.activate() == [SetPrefetch(1, 10), StartConsuming(1)]


def test_no_refill_while_more_than_the_threshold_is_buffered() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    tags = deliver(flow, 1, 10)
    actions = [a for tag in tags[:4] for a in flow.processed(1, tag)]
    assert actions == []
    assert flow.stats(1).buffered == 6


def test_refill_at_the_threshold_acks_the_processed_batch() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    tags = deliver(flow, 1, 10)
    for tag in tags[:4]:
        flow.processed(1, tag)
    # Prefetch stays 10: the ack of 5 messages is the refill of 5.
    assert flow.processed(1, tags[4]) == [Ack(1, 5)]
    assert flow.stats(1).grants == (10, 5)


def test_buffer_never_exceeds_the_limit_through_many_refills() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    credit, buffered_peak = 10, 0
    for tag in range(1, 201):
        if credit:  # the broker delivers what it may
            for _ in range(credit):
                flow.delivered(1)
            credit = 0
        buffered_peak = max(buffered_peak, flow.stats(1).buffered)
        for action in flow.processed(1, tag):
            if isinstance(action, Ack):
                credit = flow.stats(1).credit
    assert buffered_peak == 10
    assert all(5 <= g <= 10 for g in flow.stats(1).grants)


def test_client_acknowledge_raises_prefetch_instead_of_acking() -> None:
    flow = started()
    flow.register(1, limit=4, threshold_pct=50, app_acks=True)
    tags = deliver(flow, 1, 4)
    flow.processed(1, tags[0])
    # Two processed (not acknowledged) + two buffered + two new credits.
    assert flow.processed(1, tags[1]) == [SetPrefetch(1, 6)]


def test_application_acknowledge_acks_and_shrinks_prefetch_first() -> None:
    flow = started()
    flow.register(1, limit=4, threshold_pct=50, app_acks=True)
    tags = deliver(flow, 1, 4)
    flow.processed(1, tags[0])
    flow.processed(1, tags[1])
    assert flow.acknowledged(1) == [SetPrefetch(1, 4), Ack(1, 2)]


def test_prefetch_is_never_set_to_zero() -> None:
    flow = started(1)
    flow.register(1, limit=4, threshold_pct=0, app_acks=True)
    flow.register(2, limit=4, threshold_pct=0, app_acks=True)
    actions = flow.acknowledged(2)
    assert all(not (isinstance(a, SetPrefetch) and a.count == 0) for a in actions)


def test_connection_limit_caps_the_sum_over_consumers() -> None:
    flow = ConnectionFlow(12)
    for consumer in (1, 2, 3):
        flow.register(consumer, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate()
    assert flow.outstanding == 12
    assert [flow.stats(c).credit for c in (1, 2, 3)] == [4, 4, 4]


def test_connection_limit_holds_while_consumers_process() -> None:
    flow = ConnectionFlow(12)
    for consumer in (1, 2, 3):
        flow.register(consumer, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate()
    tags = dict.fromkeys((1, 2, 3), 0)
    peak = 0
    for step in range(300):
        consumer = 1 + step % 3
        while flow.stats(consumer).credit:
            flow.delivered(consumer)
        peak = max(peak, flow.buffered)
        if flow.stats(consumer).buffered:
            tags[consumer] += 1
            flow.processed(consumer, tags[consumer])
    assert peak <= 12
    assert flow.outstanding <= 12


def test_a_late_consumer_is_not_starved_by_an_idle_one() -> None:
    flow = ConnectionFlow(4)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate()  # consumer 1 holds all 4 credits on an empty queue
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.delivered(1)
    flow.delivered(1)
    flow.processed(1, 1)
    flow.processed(1, 2)
    assert flow.stats(2).credit > 0


def test_reset_forgets_buffered_messages_and_grants_again() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    deliver(flow, 1, 7)
    assert flow.reset(1) == [SetPrefetch(1, 10), StartConsuming(1)]
    assert flow.stats(1).buffered == 0


def test_unregister_returns_the_share_to_the_others() -> None:
    flow = ConnectionFlow(10)
    flow.register(1, limit=1000, threshold_pct=100, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=100, app_acks=False)
    flow.activate()
    flow.unregister(2)
    deliver(flow, 1, 5)
    flow.processed(1, 1)
    assert flow.stats(1).credit + flow.stats(1).buffered == 10


def test_bad_registration_is_refused() -> None:
    flow = ConnectionFlow()
    with pytest.raises(ValueError, match="threshold"):
        flow.register(1, limit=10, threshold_pct=101, app_acks=False)


def test_idle_auto_consumer_acks_at_once_without_changing_prefetch() -> None:
    flow = started()
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    deliver(flow, 1, 3)  # a quiet queue: 3 of 1000 credits used
    flow.processed(1, 1)
    flow.processed(1, 2)
    assert flow.processed(1, 3) == [Ack(1, 3)]
    assert flow.stats(1).credit == 1000


def test_closing_an_auto_consumer_acks_what_it_processed() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    deliver(flow, 1, 10)
    flow.processed(1, 1)
    assert flow.unregister(1) == [Ack(1, 1)]


def test_closing_a_client_ack_consumer_leaves_unacknowledged_messages() -> None:
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=True)
    deliver(flow, 1, 10)
    flow.processed(1, 1)
    assert flow.unregister(1) == []
