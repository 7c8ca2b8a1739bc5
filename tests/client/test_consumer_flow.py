import pytest

from rabbitflow._consumer_flow import (
    Ack,
    ConnectionFlow,
    ProbeQueue,
    SetPrefetch,
    StartConsuming,
    StopConsuming,
)


def started(limit: int | None = None) -> ConnectionFlow:
    flow = ConnectionFlow(limit)
    flow.activate()
    return flow


def deliver(
    flow: ConnectionFlow, consumer: int, count: int, first_tag: int = 1, now: float = 0.0
) -> list[int]:
    for _ in range(count):
        flow.delivered(consumer, now=now)
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


def test_connection_limit_is_one_total_not_a_share_per_consumer() -> None:
    flow = ConnectionFlow(60)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate()
    assert flow.outstanding == 60
    assert [flow.stats(c).credit for c in (1, 2)] == [60, 0]


def test_a_hungry_consumer_takes_back_credit_left_unused() -> None:
    flow = ConnectionFlow(60, idle_after=0.25)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)  # its queue is empty
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate(now=0.0)
    assert flow.tick(0.1) == []  # consumer 1's credit is not stale yet
    assert flow.wake_at() == 0.25
    # Deliveries on their way to consumer 1 may still arrive (and be rejected
    # back to the queue): its credit is the pool's only at the cancel-ok.
    assert flow.tick(0.25) == [StopConsuming(1)]
    assert flow.outstanding == 60
    assert flow.reclaim_confirmed(1, now=0.26) == [SetPrefetch(2, 60), StartConsuming(2)]
    assert [flow.stats(c).credit for c in (1, 2)] == [0, 60]


def test_credit_taken_back_by_a_lower_prefetch_is_granted_only_once_the_broker_confirms() -> None:
    """Deliveries the broker sent before a lower prefetch took effect still
    arrive: the credit is the pool's only at the qos-ok, which follows them."""
    flow = ConnectionFlow(60, idle_after=0.25)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate(now=0.0)
    deliver(flow, 1, 10, now=0.0)  # buffered, not yet processed; 50 credits left

    assert flow.tick(0.25) == [SetPrefetch(1, 10, confirm=True)]  # nothing for 2 yet
    assert flow.stats(2).credit == 0
    deliver(flow, 1, 5, now=0.26)  # sent under the old prefetch, arriving after the tick
    assert flow.buffered == 15
    assert flow.buffered + flow.stats(2).credit <= 60

    assert flow.reclaim_confirmed(1, now=0.27) == [SetPrefetch(2, 45), StartConsuming(2)]
    deliver(flow, 2, 45, now=0.28)
    assert flow.buffered == 60  # the limit, not 65
    assert flow.reclaim_confirmed(1, now=0.29) == []  # nothing more was pending


def test_a_reset_consumer_no_longer_holds_credit_it_was_giving_back() -> None:
    flow = ConnectionFlow(60, idle_after=0.25)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate(now=0.0)
    deliver(flow, 1, 10, now=0.0)
    assert flow.tick(0.25) == [SetPrefetch(1, 10, confirm=True)]
    flow.reset(1, now=0.3)  # a new channel (recovery): nothing more comes on the old one
    assert flow.stats(2).credit > 0  # the pool is free again
    assert flow.reclaim_confirmed(1, now=0.31) == []  # the old channel's qos-ok is stale
    assert flow.buffered + sum(flow.stats(c).credit for c in (1, 2)) <= 60


def test_busy_consumer_batches_follow_the_threshold_rule_under_a_connection_limit() -> None:
    flow = ConnectionFlow(60, idle_after=0.25)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)  # its queue is empty
    flow.activate(now=0.0)
    now = peak = tag = 0.0
    for _ in range(600):  # consumer 1's queue is full: the broker fills every credit
        deliver(flow, 1, flow.stats(1).credit, now=now)
        peak = max(peak, flow.buffered)
        tag += 1
        now += 0.005
        flow.processed(1, int(tag), now=now)
        wake = flow.wake_at()
        if wake is not None and wake <= now:
            flow.tick(now)
    assert peak == 60
    assert flow.stats(1).max_buffered == 60
    grants = flow.stats(1).grants
    assert grants[0] == 60
    assert all(30 <= g <= 60 for g in grants), grants
    assert flow.stats(2).credit == 0  # its unused credit went back to consumer 1


def test_an_idle_consumer_does_not_nibble_at_freed_room() -> None:
    flow = ConnectionFlow(60)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate(now=0.0)
    deliver(flow, 1, 60, now=0.0)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False, now=0.0)
    flow.processed(1, 1, now=0.0)
    assert flow.stats(2).credit == 0  # 1 free slot is no batch
    for tag in range(2, 30):
        flow.processed(1, tag, now=0.0)
    assert flow.stats(2).credit == 0
    flow.processed(1, 30, now=0.0)
    # At consumer 1's threshold there is room for a batch: the never-granted
    # consumer 2 has waited longest and gets it.
    assert flow.stats(2).credit == 30
    assert flow.outstanding == 60


def test_a_stopped_consumer_is_probed_and_wants_a_batch_when_its_queue_fills() -> None:
    flow = ConnectionFlow(60, idle_after=0.25, probe_interval=1.0)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False)
    flow.activate(now=0.0)
    assert flow.tick(0.25) == [StopConsuming(1)]
    flow.reclaim_confirmed(1, now=0.26)  # cancel-ok: consumer 2 holds the pool
    deliver(flow, 2, 60, now=0.3)
    assert flow.wake_at() == 1.25
    assert flow.tick(1.25) == [ProbeQueue(1)]
    assert flow.queue_depth(1, 0, now=1.3) == []
    flow.tick(2.25)
    flow.queue_depth(1, 5, now=2.3)
    for tag in range(1, 31):  # consumer 2 reaches its threshold: consumer 1 is served first
        flow.processed(2, tag, now=2.4)
    assert flow.stats(1).credit == 30
    assert flow.stats(2).credit == 0
    assert flow.outstanding == 60


def test_a_stopped_client_ack_consumer_can_still_acknowledge() -> None:
    flow = ConnectionFlow(10, idle_after=0.25)
    flow.register(1, limit=1000, threshold_pct=50, app_acks=True)
    flow.activate(now=0.0)
    deliver(flow, 1, 2, now=0.0)
    flow.processed(1, 1, now=0.0)
    flow.processed(1, 2, now=0.0)
    flow.register(2, limit=1000, threshold_pct=50, app_acks=False, now=0.0)
    flow.tick(0.5)  # consumer 2 takes consumer 1's unused credit
    assert flow.stats(1).credit == 0
    assert flow.acknowledged(1, now=0.6) == [Ack(1, 2)]


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


def test_idle_auto_consumer_acks_once_its_credit_went_unused_without_changing_prefetch() -> None:
    flow = started()
    flow.register(1, limit=1000, threshold_pct=50, app_acks=False)
    deliver(flow, 1, 3, now=1.0)  # a quiet queue: 3 of 1000 credits used
    assert [flow.processed(1, tag, now=1.01) for tag in (1, 2, 3)] == [[], [], []]
    # Not idle yet: more deliveries may be on their way.
    assert flow.wake_at() == pytest.approx(1.0 + flow.idle_after)
    assert flow.tick(1.0 + flow.idle_after / 2) == []
    assert flow.tick(1.0 + flow.idle_after) == [Ack(1, 3)]
    assert flow.stats(1).credit == 1000
    assert flow.wake_at() is None


def test_a_late_batch_is_not_topped_up_one_message_at_a_time() -> None:
    # A busy broker: the batches granted at the threshold arrive late and a
    # message at a time, each processed before the next arrives.
    flow = started()
    flow.register(1, limit=10, threshold_pct=50, app_acks=False)
    tags = deliver(flow, 1, 10, now=1.0)
    acks = [a for tag in tags for a in flow.processed(1, tag, now=1.05)]
    assert acks == [Ack(1, 5), Ack(1, 10)]  # two batches of 5 asked for
    for tag in range(11, 16):
        deliver(flow, 1, 1, now=1.1)
        acks += flow.processed(1, tag, now=1.1)
    # The fifth of them brings buffer + credit down to the threshold: one ack of 5.
    assert acks[2:] == [Ack(1, 15)]
    assert flow.stats(1).grants == (10, 5, 5, 5)
    assert flow.tick(1.1 + flow.idle_after / 2) == []


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
