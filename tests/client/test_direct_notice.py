"""A connection straight to RabbitMQ (no gateway in Connection.Start) is noted
once per address at INFO: per-queue flow control does not apply there."""

from __future__ import annotations

import itertools
import logging

import pytest

from rabbitflow._transport_base import GATEWAY_PROPERTY, note_direct_rabbitmq

_ports = itertools.count(41_000)


def test_rabbitmq_itself_is_noted_once_per_address(caplog: pytest.LogCaptureFixture) -> None:
    port = next(_ports)
    caplog.set_level(logging.INFO, logger="rabbitflow.client")

    assert note_direct_rabbitmq({"product": b"RabbitMQ"}, "mq.example", port)
    assert not note_direct_rabbitmq({"product": b"RabbitMQ"}, "mq.example", port)

    records = [r for r in caplog.records if r.name == "rabbitflow.client"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert records[0].getMessage() == (
        f"Connected straight to RabbitMQ at mq.example:{port}, not through a rabbitflow "
        "gateway: per-queue flow control (qpid.flow_* thresholds) is not enforced"
    )


def test_a_gateway_is_not_noted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rabbitflow.client")
    properties = {"product": b"RabbitMQ", GATEWAY_PROPERTY: b"rabbitflow-broker 0.1.0"}

    assert not note_direct_rabbitmq(properties, "gw.example", next(_ports))
    assert [r for r in caplog.records if r.name == "rabbitflow.client"] == []
