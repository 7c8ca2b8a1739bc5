"""Each branch of the exception tree is also the builtin a Python caller would
catch, and the SDK raises it where that builtin fits."""

import socket

import pytest

import rabbitflow

from .fakes import make_harness

FAST = {
    "qpid.flow_control_wait_failure": 3000,
    "qpid.flow_control_wait_notify_period": 1000,
}


def producer_on_fakes(capacity: int = 1) -> tuple[rabbitflow.Session, rabbitflow.MessageProducer]:
    harness = make_harness(FAST)
    harness.broker.queues["orders"] = {}
    session = harness.factory.create_connection().create_session()
    return session, session.create_producer(session.create_queue("orders"), capacity=capacity)


def test_a_flow_control_timeout_is_caught_as_a_timeout_error() -> None:
    session, producer = producer_on_fakes()
    producer.send(session.create_text_message("1"))
    producer._gate(rabbitflow._flow.GateEvent.FLOW_OFF)  # Channel.Flow(active=false)
    with pytest.raises(TimeoutError, match="due to broker enforced flow control") as info:
        producer.send(session.create_text_message("2"))
    assert isinstance(info.value, rabbitflow.FlowControlTimeoutError)
    assert isinstance(info.value, rabbitflow.JMSException)


def test_an_unreachable_broker_is_caught_as_a_connection_error() -> None:
    with socket.socket() as sock:  # a free port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    factory = rabbitflow.ConnectionFactory(f"amqp://guest:guest@127.0.0.1:{port}/")
    with pytest.raises(ConnectionError) as info:
        factory.create_connection()
    assert isinstance(info.value, rabbitflow.ConnectionLostError)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"priority": 10}, "priority"), ({"delivery_mode": 3}, "delivery_mode")],
)
def test_a_bad_send_argument_is_caught_as_a_value_error(kwargs: dict[str, int], name: str) -> None:
    session, producer = producer_on_fakes()
    with pytest.raises(ValueError, match=name) as info:
        producer.send(session.create_text_message("x"), **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, rabbitflow.InvalidPropertyError)


def test_a_bad_property_is_caught_as_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"qpid\.flow_control_wait_failure"):
        rabbitflow.ConnectionFactory(properties={"qpid.flow_control_wait_failure": -1})


def test_a_body_of_the_wrong_type_is_caught_as_a_type_error() -> None:
    session, _ = producer_on_fakes()
    with pytest.raises(TypeError, match="must be str") as info:
        session.create_text_message(b"bytes")  # type: ignore[arg-type]
    assert isinstance(info.value, rabbitflow.MessageFormatError)


def test_a_failed_close_raises_its_own_exception_with_the_count() -> None:
    session, producer = producer_on_fakes(capacity=3)
    producer.send(session.create_text_message("1"))
    producer.send(session.create_text_message("2"))
    with pytest.raises(rabbitflow.UnconfirmedMessagesError, match="2 sent message") as info:
        producer.close()
    assert info.value.unconfirmed == 2
    assert type(info.value) is not rabbitflow.JMSException
