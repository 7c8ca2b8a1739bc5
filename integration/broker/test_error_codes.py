"""Error-code differential: mutated frames answered by the gateway as RabbitMQ answers them.

The cases and RabbitMQ's recorded answers are the table in
``tests/broker/rabbitmq_answers.py`` (recorded with
``integration/broker/record_rabbitmq_answers.py``).  Each case is sent on
its own raw connection, directly (the recording still holds) and through
the gateway (same kind of answer, same reply code, same class and method
ids).

Where the gateway deliberately differs from RabbitMQ the expected answer is
written here with its reason: before login RabbitMQ drops a connection
after a 3 s delay without a Close frame, whereas the gateway's limits
before login answer an oversized frame with ``Connection.Close`` 501.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from integration.broker._raw_amqp import Answer
from integration.broker.conftest import RunningGateway
from integration.broker.record_rabbitmq_answers import CASES as BUILDERS
from integration.broker.record_rabbitmq_answers import record_one
from integration.conftest import Broker
from tests.broker.rabbitmq_answers import CASES, RabbitMQAnswer, RecordedCase

#: Frames over 4096 bytes before Tune-Ok: refused with 501 FRAME_ERROR (the gateway's
#: limit before login; RabbitMQ closes the socket 3 s later without a Close frame).
_GATEWAY_BEFORE_LOGIN = {
    "start-ok larger than 4096": 501,
    "frame header claiming 928 KB before tune": 501,
    "tune-ok frame larger than 4096": 501,
}

_IDS = [case.name for case in CASES]


def _key(answer: RabbitMQAnswer | Answer) -> tuple[str, int, int, int]:
    return answer.kind, answer.code, answer.class_id, answer.method_id


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def test_recorded_table_holds_every_case() -> None:
    assert [(c.name, c.phase, c.data) for c in CASES] == [
        (name, phase, data) for name, (phase, _description, data) in BUILDERS.items()
    ]


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_rabbitmq_answers_as_recorded(broker: Broker, case: RecordedCase) -> None:
    host, port = _host_port(broker.url)
    got = record_one(host, port, case.phase, case.data)
    assert _key(got) == _key(case.answer), got.text


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_gateway_answers_as_rabbitmq(
    gateway_factory: Callable[..., RunningGateway], case: RecordedCase
) -> None:
    gateway = gateway_factory()
    got = record_one("127.0.0.1", gateway.port, case.phase, case.data)
    if case.name in _GATEWAY_BEFORE_LOGIN:
        assert (got.kind, got.code) == ("connection.close", _GATEWAY_BEFORE_LOGIN[case.name]), got
    elif case.answer.kind == "eof":
        # RabbitMQ ends the connection without a Close frame; the gateway must end it
        # too, and may say why first.
        assert got.kind in ("eof", "connection.close"), got
    else:
        assert _key(got) == _key(case.answer), got.text
