"""Races of a sync session's operations with a connection loss: the
transport a restart finds usable, a private subscription's queue declared
for a stale channel, a commit while another thread keeps sending, and the
transaction after a commit a loss failed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import rabbitflow

from .fakes import harness_session, lose_and_recover, make_harness, wait_for
from .test_tx_recovery import _channel_of, _transacted


class _LoseOnceUsable:
    """A session's view of its link that plays ``play`` once, just after the
    link found the connection usable (whichever call the driver makes for
    that), before the session goes on."""

    _CHECKS = frozenset({"wait_usable", "usable_transport"})

    def __init__(self, link: Any, play: Callable[[], None]) -> None:
        self.link = link
        self.play: Callable[[], None] | None = play

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.link, name)
        if name not in self._CHECKS:
            return found

        def check() -> Any:
            answer = found()
            play, self.play = self.play, None
            if play is not None:
                play()
            return answer

        return check


def test_a_restart_never_puts_the_consumer_over_the_channel_a_restore_is_giving_it() -> None:
    # recover() finds the connection usable; a loss and reconnection follow
    # before it opens the consumer's new channel, and the restore is giving
    # the consumer its channel on the new transport meanwhile.  The restart's
    # channel opened then is stale: the consumer ends with one channel, the
    # restore's left closed, and acknowledges on the one it consumes from.
    h, connection, session = harness_session(acknowledge_mode=rabbitflow.CLIENT_ACKNOWLEDGE)
    consumer = session.create_consumer(rabbitflow.Queue("orders"))
    first = h.transport
    paused, release = threading.Event(), threading.Event()

    def pause_restore() -> None:  # the restore's consumer channel, on transport 1
        paused.set()
        release.wait(5)

    def let_restore_finish() -> None:  # the restart's channel, opened during the restore
        release.set()
        wait_for(lambda: connection.reconnect_count == 1, "the reconnection")

    def lose() -> None:
        first.emit_lost()
        assert paused.wait(5)

    h.broker.after_channel_open[(1, 1)] = pause_restore
    h.broker.after_channel_open[(1, 2)] = let_restore_finish
    session._retry._link = _LoseOnceUsable(session._retry._link, lose)  # type: ignore[assignment]
    session.recover()
    assert connection.reconnect_count == 1
    live = _channel_of(h, 1, consumer)  # exactly one open channel
    assert not live.detached
    live.emit_deliver(7, b"m")
    message = consumer.receive(1)
    assert message is not None
    assert message.text == "m"
    message.acknowledge()
    for channel in h.broker.transports[1].channels:
        acks = [call for call in channel.calls if call[0] == "ack"]
        assert acks == ([("ack", 7, True)] if channel is live else [])


def test_a_private_subscription_declared_for_a_stale_channel_leaves_no_queue() -> None:
    # create_consumer(topic): a loss and recovery come before its private
    # queue is declared, so the queue is on the new transport while the
    # channel it got is on the lost one; the session opens another channel
    # and declares another queue: the first one must not stay behind.
    h, connection, session = harness_session(queue=None)
    topic = session.create_topic("prices")
    admin = session._admin
    subscribe = admin.subscribe
    lose = [lose_and_recover(h, connection)]

    def lose_then_subscribe(topic: rabbitflow.Topic, name: str) -> str:
        if lose:
            lose.pop()()
        return subscribe(topic, name)

    admin.subscribe = lose_then_subscribe  # type: ignore[method-assign]
    consumer = session.create_consumer(topic)
    assert connection.reconnect_count == 1
    private = [name for name in h.broker.queues if name.startswith("amq.gen-")]
    assert private == [consumer.queue_name]
    assert ("consume", consumer.queue_name) in _channel_of(h, 1, consumer).calls


@pytest.mark.parametrize("wait_failure", [0, None])
def test_a_commit_waits_only_for_what_was_sent_before_it(wait_failure: int | None) -> None:
    # Another thread sends each time the I/O thread has published what was
    # queued: the producer is never empty, yet commit() returns once m0 (sent
    # before it) is published, without a flow control delay or timeout.
    properties = {} if wait_failure is None else {"qpid.flow_control_wait_failure": wait_failure}
    h = make_harness(properties)
    _connection, session, [producer] = _transacted(h)
    h.transport.hold_posts()
    producer.send(session.create_text_message("m0"))
    sent = [0]

    def publish_then_send() -> None:
        h.transport.run_posts()  # the I/O thread publishes what is queued
        h.transport.hold_posts()
        sent[0] += 1
        producer.send(session.create_text_message(f"m{sent[0]}"))  # the other thread

    h.wait.during_wait.extend([publish_then_send] * 100)
    h.wait.limit = 200
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m0"]
    assert sent[0] < 5


def test_a_commit_a_loss_failed_leaves_the_retried_transaction_whole() -> None:
    # tx.commit is on its way when the connection is lost; commit() says the
    # transaction was rolled back, and the application's retry of it commits.
    h = make_harness()
    connection, session, [producer] = _transacted(h)
    producer.send(session.create_text_message("m1"))
    channel = _channel_of(h, 0, producer)
    h.broker.at_tx_commit[(0, channel.number)] = lose_and_recover(h, connection)
    with pytest.raises(rabbitflow.TransactionRolledBackError):
        session.commit()
    assert connection.reconnect_count == 1
    assert h.broker.committed == []
    producer.send(session.create_text_message("m1"))
    session.commit()
    assert [m.body for m in h.broker.committed] == [b"m1"]
