"""The logging contract: stdlib logger rabbitflow.client, fields as extras,
and the documented JSON-lines recipe."""

import io
import json
import logging

import pytest
import structlog

import rabbitflow

from .fakes import make_harness


def test_flow_records_go_to_the_stdlib_client_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=rabbitflow.LOGGER_NAME)
    harness = make_harness()
    harness.broker.queues["orders"] = {}
    session = harness.factory.create_connection().create_session()
    session.create_producer(session.create_queue("orders"))
    harness.transport.channels[-1].emit_flow(False)
    (record,) = [r for r in caplog.records if r.name == "rabbitflow.client"]
    assert record.getMessage() == "Broker enforced flow control has been enforced"
    assert record.__dict__["flow_event"] == "flow_enforced"
    assert record.__dict__["destination"] == "queue://orders"
    assert record.__dict__["capacity"] == 100


def test_the_library_does_not_configure_structlog() -> None:
    before = structlog.get_config()
    make_harness().factory.create_connection().create_session()
    assert structlog.get_config() == before


def test_json_recipe_renders_one_object_per_record() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(rabbitflow.json_formatter())
    logger = logging.getLogger(rabbitflow.LOGGER_NAME)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        harness = make_harness(
            {"qpid.flow_control_wait_failure": 2000, "qpid.flow_control_wait_notify_period": 1000}
        )
        harness.broker.queues["orders"] = {}
        session = harness.factory.create_connection().create_session()
        producer = session.create_producer(session.create_queue("orders"), capacity=1)
        producer.send(session.create_text_message("1"))
        with pytest.raises(rabbitflow.FlowControlTimeoutError):
            producer.send(session.create_text_message("2"))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    first = json.loads(stream.getvalue().splitlines()[0])
    timestamp = first.pop("timestamp")
    assert first == {
        "event": "Message send delayed by 1s due to broker enforced flow control",
        "level": "warning",
        "logger": "rabbitflow.client",
        "flow_event": "send_delayed",
        "waited_ms": 1000,
        "reason": "window_full",
        "producer": producer.id,
        "destination": "queue://orders",
        "capacity": 1,
    }
    assert timestamp.endswith("Z")
    assert len(timestamp) == len("2026-11-22T05:00:00.123Z")
