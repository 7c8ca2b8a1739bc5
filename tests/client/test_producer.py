"""The JMS producer over the fake transport: windows, flow, nacks, logs."""

import logging
import threading

import pytest

import rabbitflow
from rabbitflow._flow import Gate

from .fakes import FakeChannel, Harness, make_harness

FAST = {
    "qpid.flow_control_wait_failure": 3000,
    "qpid.flow_control_wait_notify_period": 1000,
}


def setup(
    properties: dict[str, object] | None = None, capacity: int = 2
) -> tuple[Harness, rabbitflow.Session, rabbitflow.MessageProducer, FakeChannel]:
    harness = make_harness(properties or FAST)
    harness.broker.queues["orders"] = {}
    connection = harness.factory.create_connection()
    session = connection.create_session()
    producer = session.create_producer(session.create_queue("orders"), capacity=capacity)
    channel = harness.transport.channels[-1]
    return harness, session, producer, channel


def bodies(harness: Harness) -> list[bytes]:
    return [p.body for p in harness.broker.published]


def flow_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rabbitflow.client"]


def test_send_publishes_to_the_default_exchange_with_the_queue_name() -> None:
    harness, session, producer, _ = setup()
    producer.send(session.create_text_message("hi"))
    sent = harness.broker.published[0]
    assert (sent.exchange, sent.routing_key, sent.body) == ("", "orders", b"hi")


def test_producer_channel_is_in_confirm_mode() -> None:
    _, _, _, channel = setup()
    assert channel.confirming


def test_send_sets_jms_headers() -> None:
    harness, session, producer, _ = setup()
    message = session.create_text_message("hi")
    producer.send(message, priority=7, time_to_live=5000)
    props = harness.broker.published[0].props
    assert message.message_id is not None
    assert message.message_id.startswith("ID:")
    assert props.message_id == message.message_id
    assert (props.priority, props.delivery_mode, props.expiration) == (7, 2, "5000")
    assert str(message.destination) == "queue://orders"


def test_each_message_gets_its_own_id() -> None:
    harness, session, producer, _channel = setup(capacity=5)
    for _ in range(3):
        producer.send(session.create_bytes_message(b"x"))
    assert len({p.props.message_id for p in harness.broker.published}) == 3


def test_topic_publishes_to_its_exchange() -> None:
    harness = make_harness(FAST)
    session = harness.factory.create_connection().create_session()
    topic = session.create_topic("prices")
    producer = session.create_producer(topic)
    producer.send(session.create_text_message("1.5"))
    sent = harness.broker.published[0]
    assert (sent.exchange, sent.routing_key) == ("prices", "prices")
    assert harness.broker.exchanges["prices"] == "topic"


def test_send_waits_on_a_full_window_then_fails_with_the_spec_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    harness, session, producer, _ = setup(capacity=2)
    producer.send(session.create_text_message("1"))
    producer.send(session.create_text_message("2"))
    with pytest.raises(
        rabbitflow.FlowControlTimeoutError,
        match=r"^Unable to send message for 3 seconds due to broker enforced flow control$",
    ):
        producer.send(session.create_text_message("3"))
    assert bodies(harness) == [b"1", b"2"]  # the third was not sent
    messages = [(r.levelname, r.getMessage()) for r in flow_records(caplog)]
    assert messages == [
        ("WARNING", "Message send delayed by 1s due to broker enforced flow control"),
        ("WARNING", "Message send delayed by 2s due to broker enforced flow control"),
        ("ERROR", "Message send failed due to timeout waiting on broker enforced flow control"),
    ]


def test_flow_records_carry_structured_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    _, session, producer, _ = setup(capacity=1)
    producer.send(session.create_text_message("1"))
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        producer.send(session.create_text_message("2"))
    delayed, failed = flow_records(caplog)[0], flow_records(caplog)[-1]
    assert delayed.__dict__["flow_event"] == "send_delayed"
    assert delayed.__dict__["waited_ms"] == 1000
    assert failed.__dict__["flow_event"] == "send_failed"
    assert failed.__dict__["waited_ms"] == 3000
    for record in (delayed, failed):
        assert record.__dict__["producer"] == producer.id
        assert record.__dict__["destination"] == "queue://orders"
        assert record.__dict__["capacity"] == 1


def test_zero_wait_failure_waits_silently_for_confirms_on_a_full_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    harness, session, producer, channel = setup({"qpid.flow_control_wait_failure": 0}, capacity=1)
    producer.send(session.create_text_message("1"))
    # A full window is not flow control: the send waits for the confirm
    # (which comes during its fourth wait) instead of raising.
    harness.wait.during_wait = [
        lambda: None,
        lambda: None,
        lambda: None,
        lambda: channel.emit_ack(1),
    ]
    producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"1", b"2"]
    assert len(harness.wait.waits) == 4
    assert flow_records(caplog) == []


def test_zero_wait_failure_raises_at_once_under_channel_flow() -> None:
    harness, session, producer, channel = setup({"qpid.flow_control_wait_failure": 0}, capacity=5)
    channel.emit_flow(False)
    with pytest.raises(rabbitflow.FlowControlTimeoutError, match="for 0 seconds"):
        producer.send(session.create_text_message("1"))
    assert bodies(harness) == []
    assert harness.wait.waits == []


def test_zero_wait_failure_raises_at_once_while_the_connection_is_blocked() -> None:
    harness, session, producer, _ = setup({"qpid.flow_control_wait_failure": 0}, capacity=5)
    harness.transport.emit_blocked()
    with pytest.raises(rabbitflow.FlowControlTimeoutError, match="for 0 seconds"):
        producer.send(session.create_text_message("1"))
    assert bodies(harness) == []


def test_zero_wait_failure_raises_at_once_while_a_nack_awaits_resend() -> None:
    harness, session, producer, channel = setup({"qpid.flow_control_wait_failure": 0}, capacity=5)
    producer.send(session.create_text_message("1"))
    channel.emit_nack(1)
    with pytest.raises(rabbitflow.FlowControlTimeoutError, match="for 0 seconds"):
        producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"1"]


def test_zero_wait_failure_raises_when_flow_arrives_during_a_full_window_wait() -> None:
    harness, session, producer, channel = setup({"qpid.flow_control_wait_failure": 0}, capacity=1)
    producer.send(session.create_text_message("1"))
    harness.wait.during_wait = [lambda: channel.emit_flow(False)]
    with pytest.raises(rabbitflow.FlowControlTimeoutError, match="for 0 seconds"):
        producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"1"]


def test_confirm_frees_the_window() -> None:
    harness, session, producer, channel = setup(capacity=1)
    producer.send(session.create_text_message("1"))
    channel.emit_ack(1)
    producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"1", b"2"]
    assert producer.confirmed_count == 1


def test_a_send_finding_its_pump_posted_a_while_ago_waits_for_it_to_run() -> None:
    harness, session, producer, _ = setup(capacity=10)
    harness.transport.hold_posts()
    producer.send(session.create_text_message("1"))
    producer.send(session.create_text_message("2"))
    assert harness.wait.waits == []  # the pump was posted just now
    harness.clock.advance(0.002)
    producer.send(session.create_text_message("3"))
    # The send stepped aside (a short wait, not a flow-control one) and
    # returned: the message is accepted whatever the wait's outcome.
    assert harness.wait.waits == [0.002]
    assert producer.sent_count == 3
    harness.transport.run_posts()
    assert bodies(harness) == [b"1", b"2", b"3"]


def test_a_send_does_not_wait_for_its_pump_while_other_producers_pumps_wait() -> None:
    harness, session, producer, _ = setup(capacity=10)
    other = session.create_producer(session.create_queue("orders"), capacity=10)
    harness.transport.hold_posts()
    producer.send(session.create_text_message("1"))
    other.send(session.create_text_message("a"))
    harness.clock.advance(0.002)
    producer.send(session.create_text_message("2"))
    assert harness.wait.waits == []
    harness.transport.run_posts()
    assert bodies(harness) == [b"1", b"2", b"a"]


def test_a_confirm_leaves_what_is_queued_to_the_publish_turn_already_posted() -> None:
    # One publish turn per burst of sends: a confirm that arrives before the
    # posted turn runs does not publish ahead of it (which would leave that
    # turn nothing to do and make the next send post another).
    harness, session, producer, channel = setup(capacity=3)
    producer.send(session.create_bytes_message(b"1"))
    harness.transport.hold_posts()
    producer.send(session.create_bytes_message(b"2"))
    channel.emit_ack(1)
    assert bodies(harness) == [b"1"]
    producer.send(session.create_bytes_message(b"3"))
    assert len(harness.transport.held_posts or []) == 1
    harness.transport.run_posts()
    assert bodies(harness) == [b"1", b"2", b"3"]
    channel.emit_ack(3, multiple=True)
    assert producer.unconfirmed_count == 0


def test_channel_flow_holds_publishes_and_logs_enforcement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitflow.client")
    harness, session, producer, channel = setup(capacity=5)
    channel.emit_flow(False)
    assert producer.flow_state == "flowed"
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        producer.send(session.create_text_message("1"))
    channel.emit_flow(True)
    producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"2"]
    infos = [
        (r.getMessage(), r.__dict__["flow_event"])
        for r in flow_records(caplog)
        if r.levelno == logging.INFO
    ]
    assert infos == [
        ("Broker enforced flow control has been enforced", "flow_enforced"),
        ("Broker enforced flow control is no longer in effect", "flow_removed"),
    ]


def test_connection_blocked_holds_every_producer() -> None:
    harness, session, producer, _ = setup(capacity=5)
    harness.transport.emit_blocked("low on memory")
    assert producer.flow_state == "blocked"
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        producer.send(session.create_text_message("1"))
    harness.transport.emit_unblocked()
    producer.send(session.create_text_message("2"))
    assert bodies(harness) == [b"2"]


def test_producer_created_while_blocked_starts_blocked() -> None:
    harness, session, _, _ = setup()
    harness.transport.emit_blocked()
    late = session.create_producer(session.create_queue("orders"))
    assert late.flow_state == Gate.BLOCKED.value


def test_nacked_messages_are_resent_in_order_after_the_backoff() -> None:
    harness, session, producer, channel = setup(capacity=3)
    for n in (b"1", b"2", b"3"):
        producer.send(session.create_bytes_message(n))
    channel.emit_ack(1)
    channel.emit_nack(3, multiple=True)  # 2 and 3 refused
    assert bodies(harness) == [b"1", b"2", b"3"]
    harness.clock.advance(1.0)
    harness.transport.fire_timers()
    assert bodies(harness)[3:] == [b"2"]  # one at a time
    channel.emit_ack(4)
    assert bodies(harness)[3:] == [b"2", b"3"]
    channel.emit_ack(5)
    assert producer.nacked_count == 2
    assert producer.unconfirmed_count == 0


def test_send_waits_while_nacked_messages_await_resend() -> None:
    _, session, producer, channel = setup(capacity=3)
    producer.send(session.create_text_message("1"))
    channel.emit_nack(1)
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        producer.send(session.create_text_message("2"))


def test_send_with_a_second_destination_is_refused() -> None:
    _, session, producer, _ = setup()
    with pytest.raises(rabbitflow.InvalidDestinationError, match="orders"):
        producer.send(session.create_text_message("x"), rabbitflow.Queue("other"))


def test_anonymous_producer_needs_a_destination_per_send() -> None:
    harness, session, _, _ = setup()
    anonymous = session.create_producer()
    with pytest.raises(rabbitflow.InvalidDestinationError, match="no destination"):
        anonymous.send(session.create_text_message("x"))
    anonymous.send(session.create_text_message("x"), rabbitflow.Queue("orders"))
    assert harness.broker.published[-1].routing_key == "orders"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"priority": 10}, "priority"),
        ({"delivery_mode": 3}, "delivery_mode"),
        ({"time_to_live": -1}, "time_to_live"),
        ({"time_to_live": 1 << 63}, "time_to_live"),
    ],
)
def test_bad_send_arguments_name_the_argument(kwargs: dict[str, int], name: str) -> None:
    _, session, producer, _ = setup()
    with pytest.raises(rabbitflow.InvalidPropertyError, match=name):
        producer.send(session.create_text_message("x"), **kwargs)


# (message attribute, value AMQP cannot carry, what the error says)
UNSENDABLE = [
    pytest.param(
        "correlation_id",
        "c" * 256,
        "correlation_id is 256 bytes in UTF-8, over AMQP's limit of 255",
        id="long-correlation-id",
    ),
    pytest.param("correlation_id", "é" * 128, "correlation_id is 256 bytes", id="utf8-bytes"),
    pytest.param("correlation_id", 42, "correlation_id must be a str, got int", id="not-text"),
    pytest.param("type", "t" * 300, "type is 300 bytes", id="long-type"),
    pytest.param(
        "reply_to", rabbitflow.Queue("r" * 250), "reply_to is 258 bytes", id="long-reply-to"
    ),
    pytest.param(
        "properties", {"p" * 256: 1}, "property name is 256 bytes", id="long-property-name"
    ),
    pytest.param(
        "properties",
        {"big": 1 << 63},
        "property 'big': 9223372036854775808 is outside the AMQP integer range",
        id="int-over-64-bits",
    ),
    pytest.param(
        "properties", {"low": -(1 << 63) - 1}, "property 'low': .* is outside", id="int-under"
    ),
    pytest.param(
        "properties",
        {"ratio": 0.5},
        "property 'ratio': a value of type float cannot be sent",
        id="float",
    ),
    pytest.param(
        "properties", {"when": object()}, "property 'when': a value of type object", id="other-type"
    ),
]


@pytest.mark.parametrize(("attribute", "value", "error"), UNSENDABLE)
def test_a_message_amqp_cannot_carry_is_refused_before_it_is_accepted(
    attribute: str, value: object, error: str
) -> None:
    harness, session, producer, channel = setup()
    bad = session.create_text_message("bad")
    setattr(bad, attribute, value)
    with pytest.raises(rabbitflow.MessageFormatError, match=error):
        producer.send(bad)
    assert (producer.sent_count, producer.unconfirmed_count) == (0, 0)
    # The producer goes on, its confirm tags in step with the broker's.
    producer.send(session.create_text_message("good"))
    channel.emit_ack(1)
    assert bodies(harness) == [b"good"]
    assert (producer.confirmed_count, producer.unconfirmed_count) == (1, 0)


def test_a_message_at_the_amqp_limits_is_sent() -> None:
    harness, session, producer, channel = setup()
    message = session.create_text_message("edge")
    message.correlation_id = "é" * 127  # 254 bytes
    message.type = "t" * 255
    message.reply_to = rabbitflow.Queue("r" * 247)  # queue://... is 255 bytes
    message.properties = {"p" * 255: (1 << 63) - 1, "low": -(1 << 63), "ok": True, "s": "x"}
    producer.send(message)  # the fake channel encodes it as the real one does
    channel.emit_ack(1)
    assert bodies(harness) == [b"edge"]
    assert producer.confirmed_count == 1


def test_bad_capacity_is_refused() -> None:
    _, session, _, _ = setup()
    with pytest.raises(rabbitflow.InvalidPropertyError, match="capacity"):
        session.create_producer(capacity=0)


def test_default_capacity_comes_from_the_property() -> None:
    harness = make_harness({"rabbitflow.producer_capacity": 7})
    session = harness.factory.create_connection().create_session()
    assert session.create_producer().capacity == 7


def test_send_on_a_closed_producer_is_refused() -> None:
    _, session, producer, _ = setup()
    producer.close()
    with pytest.raises(rabbitflow.IllegalStateError, match="closed"):
        producer.send(session.create_text_message("x"))


def test_close_reports_how_many_are_unconfirmed_and_that_they_may_be_enqueued() -> None:
    _, session, producer, _ = setup()
    producer.send(session.create_text_message("x"))
    with pytest.raises(
        rabbitflow.JMSException,
        match=r"1 sent message\(s\) not confirmed by the broker within 3 s; "
        r"they may still be enqueued$",
    ):
        producer.close()


def test_close_waits_for_confirms_at_most_the_wait_failure_time() -> None:
    harness, session, producer, _ = setup()  # wait-failure 3000 ms
    producer.send(session.create_text_message("x"))
    start = harness.clock.now
    with pytest.raises(rabbitflow.JMSException):
        producer.close()
    assert harness.clock.now - start == pytest.approx(3.0)


def test_close_with_zero_wait_failure_does_not_wait() -> None:
    harness, session, producer, _ = setup({"qpid.flow_control_wait_failure": 0})
    producer.send(session.create_text_message("x"))
    with pytest.raises(rabbitflow.JMSException, match="1 sent message"):
        producer.close()
    assert harness.wait.waits == []


def test_close_returns_when_the_last_confirm_arrives_while_it_waits() -> None:
    harness, session, producer, channel = setup()
    producer.send(session.create_text_message("x"))
    harness.wait.during_wait = [lambda: channel.emit_ack(1)]
    producer.close()
    assert len(harness.wait.waits) == 1


def test_close_returns_once_everything_is_confirmed() -> None:
    harness, session, producer, channel = setup()
    producer.send(session.create_text_message("x"))
    channel.emit_ack(1)
    producer.close()
    assert harness.wait.waits == []  # nothing left to wait for
    assert channel.closed
    with pytest.raises(rabbitflow.IllegalStateError, match="is closed"):
        producer.send(session.create_text_message("y"))


def test_channel_closed_by_the_broker_fails_sends_and_tells_the_listener() -> None:
    _, session, producer, channel = setup()
    errors: list[rabbitflow.JMSException] = []
    session.connection.set_exception_listener(errors.append)
    closed = rabbitflow.ProtocolError("CHN-1012 flow control ignored")
    channel.emit_closed(closed)
    assert errors == [closed]
    with pytest.raises(rabbitflow.ProtocolError, match="CHN-1012"):
        producer.send(session.create_text_message("x"))


def test_connection_context_manager_closes_the_transport() -> None:
    harness = make_harness(FAST)
    with harness.factory.create_connection() as connection:
        connection.create_session()
    assert harness.transport.closing
    with pytest.raises(rabbitflow.IllegalStateError):
        connection.start()


def test_a_send_accepted_as_a_nack_arrives_is_published_once_the_retry_ends() -> None:
    # The send's publish turn (posted to the I/O thread) runs after the nack
    # put the window in retry; nothing else is sent afterwards.
    harness, session, producer, channel = setup(capacity=3)
    producer.send(session.create_bytes_message(b"1"))
    harness.transport.hold_posts()
    producer.send(session.create_bytes_message(b"2"))
    channel.emit_nack(1)
    harness.transport.run_posts()
    assert bodies(harness) == [b"1"]
    harness.clock.advance(1.0)
    harness.transport.fire_timers()
    assert bodies(harness) == [b"1", b"1"]
    channel.emit_ack(2)
    assert bodies(harness) == [b"1", b"1", b"2"]
    channel.emit_ack(3)
    assert producer.unconfirmed_count == 0
    producer.close()


def test_a_resend_timer_lost_with_its_connection_does_not_stop_the_next_one() -> None:
    harness, session, producer, channel = setup(capacity=3)
    connection = session.connection
    producer.send(session.create_bytes_message(b"1"))
    channel.emit_nack(1)  # re-send timer armed on this connection's loop
    first = harness.transport
    assert first.timers
    first.emit_lost()  # ... and lost with it
    pause = threading.Event()
    for _ in range(500):
        if connection.reconnect_count == 1:
            break
        pause.wait(0.01)
    assert harness.transport is not first
    assert harness.transport.timers, "no re-send timer on the new connection"
    harness.clock.advance(1.0)
    harness.transport.fire_timers()
    assert bodies(harness) == [b"1", b"1"]
    harness.transport.channels[-1].emit_ack(1)
    assert producer.unconfirmed_count == 0
