"""The per-queue threshold machine, thresholds validation and defaults."""

from __future__ import annotations

import datetime as dt

import pytest

from rabbitflow_broker.engine.flow import (
    TRANSITIONS,
    FlowInput,
    FlowState,
    IllegalTransition,
    QueueFlow,
    ThresholdError,
    Thresholds,
    default_thresholds,
    derived_resume,
    thresholds_from_arguments,
    with_derived_resume,
)
from rabbitflow_broker.events import QueueOverfull, QueueUnderfull

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
BOTH = Thresholds(stop_count=4000, resume_count=3000, stop_size=8000, resume_size=6000)


def _flow(thresholds: Thresholds = BOTH) -> QueueFlow:
    return QueueFlow("/", "orders", thresholds)


def test_starts_off_with_no_stops_counted() -> None:
    flow = _flow()
    assert flow.state is FlowState.OFF
    assert flow.flow_stopped_count == 0


def test_count_at_stop_does_not_turn_on() -> None:
    assert _flow().observe(4000, 0, NOW) is None


def test_count_over_stop_turns_on_with_overfull_event() -> None:
    flow = _flow()
    event = flow.observe(4001, 100, NOW)
    assert event == QueueOverfull(
        ts=NOW,
        vhost="/",
        queue="orders",
        size=100,
        capacity=8000,
        messages=4001,
        message_capacity=4000,
    )
    assert flow.stopped


def test_bytes_over_stop_turns_on() -> None:
    flow = _flow()
    assert isinstance(flow.observe(1, 8001, NOW), QueueOverfull)


def test_each_off_to_on_counts_once() -> None:
    flow = _flow()
    flow.observe(4001, 0, NOW)
    assert flow.observe(5000, 0, NOW) is None
    assert flow.flow_stopped_count == 1


def test_stays_on_while_count_not_below_resume() -> None:
    flow = _flow()
    flow.observe(4001, 0, NOW)
    assert flow.observe(3000, 0, NOW) is None
    assert flow.stopped


def test_stays_on_while_bytes_not_below_resume() -> None:
    flow = _flow()
    flow.observe(4001, 0, NOW)
    assert flow.observe(10, 6000, NOW) is None
    assert flow.stopped


def test_turns_off_when_both_below_resume() -> None:
    flow = _flow()
    flow.observe(4001, 0, NOW)
    event = flow.observe(2999, 5999, NOW)
    assert event == QueueUnderfull(
        ts=NOW,
        vhost="/",
        queue="orders",
        size=5999,
        resume_capacity=6000,
        messages=2999,
        message_capacity=3000,
    )
    assert not flow.stopped


def test_unset_dimension_counts_as_satisfied_for_resume() -> None:
    flow = _flow(Thresholds(stop_count=100, resume_count=50))
    flow.observe(101, 10**9, NOW)
    assert isinstance(flow.observe(49, 10**9, NOW), QueueUnderfull)


def test_second_stop_counts_again() -> None:
    flow = _flow()
    flow.observe(4001, 0, NOW)
    flow.observe(0, 0, NOW)
    flow.observe(4001, 0, NOW)
    assert flow.flow_stopped_count == 2


def test_time_stopped_adds_up_closed_and_current_episodes() -> None:
    flow = _flow()
    second = dt.timedelta(seconds=1)
    assert flow.stopped_seconds(NOW) == 0.0
    flow.observe(4001, 0, NOW)
    flow.observe(0, 0, NOW + 3 * second)
    assert flow.stopped_seconds(NOW + 10 * second) == 3.0
    flow.observe(4001, 0, NOW + 20 * second)
    assert flow.stopped_seconds(NOW + 22 * second) == 5.0


def test_disabled_thresholds_never_stop() -> None:
    flow = _flow(Thresholds())
    assert flow.observe(10**9, 10**12, NOW) is None


def test_transition_table_has_only_the_two_moves() -> None:
    assert TRANSITIONS == {
        (FlowState.OFF, FlowInput.OVERFULL): FlowState.ON,
        (FlowState.ON, FlowInput.UNDERFULL): FlowState.OFF,
    }


def test_illegal_transition_names_state_and_input() -> None:
    flow = _flow()
    with pytest.raises(IllegalTransition, match=r"OFF.*UNDERFULL"):
        flow._move(FlowInput.UNDERFULL)


# -- validation ---------------------------------------------------------------------


def test_resume_above_stop_is_refused_naming_resume() -> None:
    with pytest.raises(ThresholdError, match=r"qpid\.flow_resume_count"):
        Thresholds(stop_count=10, resume_count=20)


def test_negative_is_refused_naming_it() -> None:
    with pytest.raises(ThresholdError, match=r"qpid\.flow_stop_size"):
        Thresholds(stop_size=-1)


@pytest.mark.parametrize("value", ["100", 1.5, True, None])
def test_non_integer_argument_is_refused(value: object) -> None:
    with pytest.raises(ThresholdError, match=r"qpid\.flow_stop_count"):
        thresholds_from_arguments({"qpid.flow_stop_count": value})


def test_no_qpid_arguments_means_none() -> None:
    assert thresholds_from_arguments({"x-max-length": 5}) is None


def test_all_four_arguments_are_taken_as_given() -> None:
    arguments = {
        "qpid.flow_stop_count": 4000,
        "qpid.flow_resume_count": 3000,
        "qpid.flow_stop_size": 8000,
        "qpid.flow_resume_size": 6000,
    }
    assert thresholds_from_arguments(arguments) == BOTH


def test_missing_resume_follows_stop_at_broker_ratio() -> None:
    got = thresholds_from_arguments({"qpid.flow_stop_count": 800}, stop_pct=80, resume_pct=70)
    assert got == Thresholds(stop_count=800, resume_count=700)


def test_both_stops_zero_disable() -> None:
    got = thresholds_from_arguments({"qpid.flow_stop_count": 0, "qpid.flow_stop_size": 0})
    assert got is not None
    assert not got.enabled


# -- defaults -----------------------------------------------------------------------


def _defaults(
    arguments: dict[str, object] | None = None,
    policy: dict[str, object] | None = None,
    stop: int = 80,
    resume: int = 70,
    limit: int = 104_857_600,
) -> Thresholds | None:
    return default_thresholds(
        arguments, policy, stop_pct=stop, resume_pct=resume, default_queue_limit=limit
    )


def test_reject_publish_max_length_defaults_to_percentages() -> None:
    got = _defaults({"x-max-length": 1000, "x-overflow": "reject-publish"})
    assert got == Thresholds(stop_count=800, resume_count=700)


def test_other_percentages_change_defaults() -> None:
    got = _defaults({"x-max-length": 1000, "x-overflow": "reject-publish"}, stop=90, resume=75)
    assert got == Thresholds(stop_count=900, resume_count=750)


def test_max_length_without_overflow_is_drop_head_without_defaults() -> None:
    assert _defaults({"x-max-length": 1000}) is None


def test_explicit_drop_head_has_no_defaults() -> None:
    assert _defaults({"x-max-length-bytes": 1000, "x-overflow": "drop-head"}) is None


def test_policy_max_length_counts() -> None:
    got = _defaults({}, {"max-length": 100, "overflow": "reject-publish"})
    assert got == Thresholds(stop_count=80, resume_count=70)


def test_lower_of_argument_and_policy_wins() -> None:
    got = _defaults({"x-max-length": 1000, "x-overflow": "reject-publish"}, {"max-length": 100})
    assert got == Thresholds(stop_count=80, resume_count=70)


def test_no_limit_uses_default_queue_limit_bytes() -> None:
    assert _defaults(limit=10_000) == Thresholds(stop_size=8000, resume_size=7000)


def test_no_limit_and_zero_default_limit_means_none() -> None:
    assert _defaults(limit=0) is None


def test_zero_percentages_disable_defaults() -> None:
    assert _defaults({"x-max-length": 10, "x-overflow": "reject-publish"}, stop=0, resume=0) is None


def test_qpid_max_count_is_a_maximum_without_x_overflow() -> None:
    assert _defaults({"qpid.max_count": 1000}) == Thresholds(stop_count=800, resume_count=700)


def test_qpid_max_size_is_a_byte_maximum_without_x_overflow() -> None:
    assert _defaults({"qpid.max_size": 10_000}) == Thresholds(stop_size=8000, resume_size=7000)


def test_lower_of_qpid_max_count_and_x_max_length_wins() -> None:
    got = _defaults({"qpid.max_count": 100, "x-max-length": 1000, "x-overflow": "reject-publish"})
    assert got == Thresholds(stop_count=80, resume_count=70)


def test_qpid_max_count_beside_an_x_max_length_without_overflow_is_drop_head() -> None:
    # RabbitMQ enforces its own maximum by dropping the head: a ring.
    assert _defaults({"qpid.max_count": 100, "x-max-length": 1000}) is None


@pytest.mark.parametrize("policy_type", ["ring", b"ring", "ring_strict"])
def test_qpid_ring_policy_has_no_defaults(policy_type: object) -> None:
    assert _defaults({"qpid.max_count": 1000, "qpid.policy_type": policy_type}) is None


def test_qpid_ring_policy_without_a_maximum_has_no_defaults() -> None:
    assert _defaults({"qpid.policy_type": "ring"}, limit=10_000) is None


def test_qpid_reject_policy_keeps_defaults() -> None:
    got = _defaults({"qpid.max_count": 1000, "qpid.policy_type": "reject"})
    assert got == Thresholds(stop_count=800, resume_count=700)


@pytest.mark.parametrize("queue_type", ["stream", b"stream"])
def test_stream_has_no_defaults(queue_type: object) -> None:
    assert _defaults({"x-queue-type": queue_type, "x-max-length-bytes": 10_000}) is None


def test_quorum_queue_has_defaults_like_a_classic_one() -> None:
    got = _defaults({"x-queue-type": "quorum"}, limit=10_000)
    assert got == Thresholds(stop_size=8000, resume_size=7000)


def test_flow_argument_on_a_stream_is_refused_naming_it() -> None:
    with pytest.raises(ThresholdError, match=r"^qpid\.flow_resume_count: .*stream") as caught:
        thresholds_from_arguments({"x-queue-type": "stream", "qpid.flow_resume_count": 0})
    assert caught.value.argument == "qpid.flow_resume_count"


def test_explicit_resume_zero_is_derived_like_an_absent_one() -> None:
    got = thresholds_from_arguments({"qpid.flow_stop_count": 80, "qpid.flow_resume_count": 0})
    assert got == Thresholds(stop_count=80, resume_count=70)


def test_zero_resume_percentage_derives_resume_at_the_default_ratio() -> None:
    got = _defaults({"x-max-length": 1000, "x-overflow": "reject-publish"}, resume=0)
    assert got == Thresholds(stop_count=800, resume_count=700)


@pytest.mark.parametrize(
    ("stop", "stop_pct", "resume_pct", "resume"),
    [(0, 80, 70, 0), (1, 80, 70, 1), (1000, 80, 70, 875), (1000, 0, 0, 875), (10, 90, 90, 10)],
)
def test_derived_resume_is_between_one_and_stop(
    stop: int, stop_pct: int, resume_pct: int, resume: int
) -> None:
    assert derived_resume(stop, stop_pct=stop_pct, resume_pct=resume_pct) == resume


def test_with_derived_resume_keeps_set_resume_values() -> None:
    kept = Thresholds(stop_count=10, resume_count=2, stop_size=100, resume_size=3)
    assert with_derived_resume(kept, stop_pct=80, resume_pct=70) is kept
