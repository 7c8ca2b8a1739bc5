"""A transacted session's messages that send() accepted and the producer has
not published yet (flow control holds them, or the pump has not run):
rollback() drops them, commit() publishes them before its tx.commit."""

from collections.abc import Callable

import pytest

import rabbitflow

from .fakes import Harness, lose_and_recover, make_harness
from .test_tx_recovery import _transacted


def _held_by_the_blocked_connection(h: Harness) -> Callable[[], None]:
    """Accepted while the connection was open, blocked before the pump ran:
    the pump publishes nothing until connection.unblocked."""
    h.transport.emit_blocked()
    h.transport.run_posts()
    return h.transport.emit_unblocked


def _waiting_for_the_pump(h: Harness) -> Callable[[], None]:
    """Accepted, the pump posted and not run yet (a busy I/O thread)."""
    return h.transport.run_posts


Hold = Callable[[Harness], Callable[[], None]]
HOLDS = [_held_by_the_blocked_connection, _waiting_for_the_pump]


def _send_unpublished(
    h: Harness, session: rabbitflow.Session, producer: rabbitflow.MessageProducer, hold: Hold
) -> Callable[[], None]:
    """Send m1 and leave it unpublished (``hold``); return what releases it."""
    h.transport.hold_posts()
    producer.send(session.create_text_message("m1"))
    release = hold(h)
    assert [m.body for m in h.broker.published] == []
    return release


@pytest.mark.parametrize("hold", HOLDS)
def test_a_rollback_drops_what_the_producer_accepted_and_has_not_published(hold: Hold) -> None:
    # m1 belongs to the rolled back transaction: it must not go out once the
    # producer may publish again, into the next one.
    h = make_harness()
    _, session, [producer] = _transacted(h)
    release = _send_unpublished(h, session, producer, hold)
    session.rollback()
    release()
    producer.send(session.create_text_message("m2"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m2"]
    assert [m.body for m in h.broker.published] == [b"m2"]
    assert producer.unconfirmed_count == 0


def test_a_commit_a_loss_broke_drops_what_the_producer_has_not_published() -> None:
    # m1 waits under connection.blocked; the connection drops and the new
    # one is blocked as it opens, so m1 still waits.  commit() rolls the
    # broken transaction back: m1 must not go out once the connection is
    # unblocked, into the next transaction.
    h = make_harness()
    connection, session, [producer] = _transacted(h)
    h.broker.block_at_connect.add(1)
    _send_unpublished(h, session, producer, _held_by_the_blocked_connection)
    lose_and_recover(h, connection)()
    with pytest.raises(rabbitflow.TransactionRolledBackError):
        session.commit()
    h.transport.emit_unblocked()
    producer.send(session.create_text_message("m2"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m2"]


def test_a_send_waiting_for_room_goes_on_once_a_rollback_dropped_what_filled_the_window() -> None:
    h = make_harness()
    h.broker.queues["orders"] = {}
    connection = h.factory.create_connection()
    session = connection.create_session(transacted=True)
    producer = session.create_producer(session.create_queue("orders"), capacity=1)
    h.transport.hold_posts()
    producer.send(session.create_text_message("m1"))  # fills the window, unpublished
    h.wait.during_wait.append(session.rollback)  # while m2 waits for room
    producer.send(session.create_text_message("m2"))
    h.transport.run_posts()
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m2"]


@pytest.mark.parametrize("hold", HOLDS)
def test_commit_publishes_what_the_producer_accepted_before_committing(hold: Hold) -> None:
    # commit() waits (as a send does) until m1 is on the channel, so that its
    # tx.commit covers it; m1 must not go out later, into the next transaction.
    h = make_harness()
    _, session, [producer] = _transacted(h)
    h.wait.during_wait.append(_send_unpublished(h, session, producer, hold))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m1"]
    producer.send(session.create_text_message("m2"))
    session.rollback()
    assert [m.body for m in h.broker.committed] == [b"m1"]


def test_a_commit_that_flow_control_holds_too_long_commits_nothing_and_stays_open() -> None:
    h = make_harness({"qpid.flow_control_wait_failure": 2000})
    _, session, [producer] = _transacted(h)
    unblock = _send_unpublished(h, session, producer, _held_by_the_blocked_connection)
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        session.commit()
    assert h.broker.committed == []
    unblock()
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m1"]
