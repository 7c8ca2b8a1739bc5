"""send() hands messages to the I/O thread in batches and writes each batch
at once; the guarantees of SPEC §2 hold across it: a send whose confirm
never comes times out, and a connection cut in the middle of a batch loses
and reorders nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

import rabbitflow

from ..conftest import Broker
from ._faults import Cut, FaultProxy
from ._support import CLIENT_LOGGER, declare_queue, drain, numbers


def test_a_send_whose_confirms_never_come_times_out(
    broker: Broker,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    queue = new_queue("noconfirm")
    declare_queue(broker.url, queue)
    with FaultProxy((broker.host, broker.port), [Cut.drop_confirms()]) as proxy:
        factory = rabbitflow.ConnectionFactory(
            proxy.url(),
            properties={
                "qpid.flow_control_wait_failure": 2000,
                "qpid.flow_control_wait_notify_period": 1000,
            },
        )
        connection = factory.create_connection()
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue), capacity=50)
        for n in range(1, 51):  # one window, handed to the I/O thread in batches
            producer.send(session.create_text_message(str(n)))
        with pytest.raises(
            rabbitflow.FlowControlTimeoutError,
            match=r"^Unable to send message for 2 seconds due to broker enforced flow control$",
        ):
            producer.send(session.create_text_message("51"))
        with pytest.raises(rabbitflow.JMSException, match="50 sent message"):
            connection.close()
        assert proxy.connections[0].dropped >= 1
    # The broker has the 50 (their confirms were lost), never the 51st.
    assert numbers(drain(broker.url, queue)) == list(range(1, 51))
    events = [r.__dict__.get("flow_event") for r in caplog.records if r.name == CLIENT_LOGGER]
    assert events.count("send_delayed") == 1
    assert events.count("send_failed") == 1


def test_a_cut_in_the_middle_of_a_batch_loses_and_reorders_nothing(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("midbatch")
    declare_queue(broker.url, queue)
    with FaultProxy((broker.host, broker.port), [Cut.inside_a_batch_after(2050)]) as proxy:
        factory = rabbitflow.ConnectionFactory(
            proxy.url(), properties={"rabbitflow.reconnect_initial_delay": 50}
        )
        with factory.create_connection() as connection:
            session = connection.create_session()
            producer = session.create_producer(session.create_queue(queue), capacity=100)
            for n in range(1, 5001):
                producer.send(session.create_text_message(str(n)))
        record = proxy.connections[0]
        assert record.cut
        assert record.cut_mid_chunk  # publishes of the same write went through before it
    received = numbers(drain(broker.url, queue))
    first = list(dict.fromkeys(received))  # a re-sent message may also come twice
    assert first == list(range(1, 5001))
    assert len(received) - len(first) <= producer.resent_count
