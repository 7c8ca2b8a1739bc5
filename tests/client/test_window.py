import pytest

from rabbitflow._exceptions import IllegalStateError
from rabbitflow._flow import GateEvent, ProducerWindow


def window(capacity: int = 3) -> ProducerWindow[str]:
    return ProducerWindow(capacity, backoff_initial=0.05, backoff_max=0.2)


def fill(w: ProducerWindow[str], *items: str) -> None:
    for item in items:
        w.accept(item)


def test_accepts_up_to_capacity() -> None:
    w = window(2)
    fill(w, "a", "b")
    assert not w.can_accept()
    assert w.wait_reason() == "window_full"


def test_accept_beyond_capacity_raises() -> None:
    w = window(1)
    fill(w, "a")
    with pytest.raises(IllegalStateError, match="window_full"):
        w.accept("b")


def test_take_assigns_consecutive_delivery_tags_in_send_order() -> None:
    w = window()
    fill(w, "a", "b", "c")
    assert [(p.tag, p.item) for p in w.take(0.0)] == [(1, "a"), (2, "b"), (3, "c")]


def test_ack_frees_room() -> None:
    w = window(1)
    fill(w, "a")
    w.take(0.0)
    assert [c.item for c in w.ack(1, multiple=False)] == ["a"]
    assert w.can_accept()


def test_multiple_ack_confirms_every_earlier_tag() -> None:
    w = window()
    fill(w, "a", "b", "c")
    w.take(0.0)
    assert [c.item for c in w.ack(2, multiple=True)] == ["a", "b"]
    assert w.in_flight == 1


def test_unknown_tag_ack_is_ignored() -> None:
    w = window()
    assert w.ack(7, multiple=False) == []


def test_nack_stops_new_sends_until_the_nacked_message_is_confirmed() -> None:
    w = window()
    fill(w, "a")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    assert not w.can_accept()
    assert w.wait_reason() == "nacked"


def test_nacked_message_is_resent_after_the_backoff() -> None:
    w = window()
    fill(w, "a")
    w.take(0.0)
    w.nack(1, multiple=False, now=10.0)
    assert w.take(10.01) == []
    assert [p.item for p in w.take(10.05)] == ["a"]


def test_nacked_messages_are_resent_one_at_a_time_in_original_order() -> None:
    w = window()
    fill(w, "a", "b", "c")
    w.take(0.0)
    w.nack(3, multiple=True, now=0.0)
    first = w.take(1.0)
    assert [(p.tag, p.item) for p in first] == [(4, "a")]
    assert w.take(1.0) == []  # waits for a's confirm before b goes out
    w.ack(4, multiple=False)
    assert [p.item for p in w.take(1.0)] == ["b"]


def test_resend_waits_for_in_flight_messages_to_settle() -> None:
    w = window()
    fill(w, "a", "b")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    assert w.take(5.0) == []  # b is still unconfirmed
    w.ack(2, multiple=False)
    assert [p.item for p in w.take(5.0)] == ["a"]


def test_backoff_doubles_per_nack_up_to_the_maximum() -> None:
    w = window()
    fill(w, "a")
    due = []
    now = 0.0
    for tag in range(1, 5):
        w.take(now)
        w.nack(tag, multiple=False, now=now)
        resend = w.resend_due()
        assert resend is not None
        due.append(round(resend - now, 3))
        now = resend
    assert due == [0.05, 0.1, 0.2, 0.2]


def test_retry_ends_when_every_nacked_message_is_confirmed() -> None:
    w = window()
    fill(w, "a")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    w.take(1.0)
    w.ack(2, multiple=False)
    assert w.can_accept()
    assert (w.nacked_count, w.confirmed_count) == (1, 1)


def test_flowed_gate_publishes_nothing() -> None:
    w = window()
    fill(w, "a")
    w.handle(GateEvent.FLOW_OFF)
    assert w.take(0.0) == []
    assert not w.can_accept()


def test_connection_loss_requeues_unconfirmed_and_counts_possible_duplicates() -> None:
    w = window()
    fill(w, "a", "b", "c")
    w.take(0.0)
    w.ack(1, multiple=False)
    w.handle(GateEvent.CONNECTION_LOST)
    assert w.take(0.0) == []  # disconnected
    w.handle(GateEvent.RECONNECTED)
    again = w.take(0.0)
    assert [(p.tag, p.item) for p in again] == [(1, "b"), (2, "c")]
    assert w.resent_count == 2


def test_messages_not_yet_published_are_not_counted_as_resent() -> None:
    w = window()
    fill(w, "a")
    w.handle(GateEvent.CONNECTION_LOST)
    w.handle(GateEvent.RECONNECTED)
    assert [p.item for p in w.take(0.0)] == ["a"]
    assert w.resent_count == 0


def test_drain_returns_everything_unconfirmed_in_send_order() -> None:
    w = window()
    fill(w, "a", "b", "c")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    assert w.drain() == ["a", "b", "c"]


def test_drop_queued_drops_only_what_is_not_published_and_frees_its_room() -> None:
    w = window(3)
    fill(w, "a", "b")
    w.take(0.0)
    fill(w, "c")
    assert w.drop_queued() == 1
    assert w.in_flight == 2
    assert w.take(0.0) == []
    assert [c.item for c in w.ack(2, multiple=True)] == ["a", "b"]
    assert w.idle
    fill(w, "d", "e", "f")  # the whole capacity again
    assert [(p.tag, p.item) for p in w.take(0.0)] == [(3, "d"), (4, "e"), (5, "f")]


def test_a_retry_of_dropped_messages_only_ends_with_the_drop() -> None:
    # A nacked message that is dropped can never be confirmed: the window
    # must not wait for it, nor flag a later message as resent.
    w = window()
    fill(w, "a", "b")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    w.handle(GateEvent.CONNECTION_LOST)  # b is queued again, to be resent
    w.handle(GateEvent.RECONNECTED)
    assert w.drop_queued() == 2
    assert w.can_accept()
    assert not w.flow_signalled
    fill(w, "c")
    assert w.take(0.0) == [(1, 3, "c", False)]
    w.nack(1, multiple=False, now=10.0)
    assert w.resend_due() == pytest.approx(10.05)  # the initial backoff again


def test_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ProducerWindow(0)


def test_a_full_window_is_not_a_flow_signal() -> None:
    w = window(1)
    fill(w, "a")
    w.take(0.0)
    assert not w.flow_signalled


@pytest.mark.parametrize("event", [GateEvent.FLOW_OFF, GateEvent.BLOCKED])
def test_flow_and_blocked_are_flow_signals(event: GateEvent) -> None:
    w = window()
    w.handle(event)
    assert w.flow_signalled


def test_a_nack_awaiting_resend_is_a_flow_signal() -> None:
    w = window()
    fill(w, "a")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    assert w.flow_signalled


def test_a_lost_connection_is_not_a_flow_signal() -> None:
    w = window()
    w.handle(GateEvent.CONNECTION_LOST)
    assert not w.flow_signalled


def test_a_message_accepted_before_a_nack_is_due_once_the_retry_ends() -> None:
    # "a" is on the wire, "b" accepted but not yet taken when "a" is nacked.
    w = window()
    fill(w, "a")
    w.take(0.0)
    fill(w, "b")
    w.nack(1, multiple=False, now=0.0)
    assert w.take(0.0) == []  # retry: "b" must wait behind the re-send of "a"
    assert w.publish_due() == 0.05
    assert [p.item for p in w.take(0.05)] == ["a"]
    assert w.publish_due() is None  # one re-send at a time
    w.ack(2, multiple=False)
    assert not w.retrying
    assert w.publish_due() == 0.0  # "b" goes out at once, whether or not more is sent
    assert [p.item for p in w.take(0.05)] == ["b"]
    assert w.publish_due() is None


def test_nothing_is_due_while_the_gate_is_shut() -> None:
    w = window()
    fill(w, "a")
    w.take(0.0)
    w.nack(1, multiple=False, now=0.0)
    w.handle(GateEvent.FLOW_OFF)
    assert w.publish_due() is None
    w.handle(GateEvent.FLOW_ON)
    assert w.publish_due() == 0.05
