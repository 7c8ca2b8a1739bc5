"""pika exceptions are translated at the transport boundary, most specific first."""

import pika.exceptions
import pytest

import rabbitflow
from rabbitflow._transport import translate_error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            pika.exceptions.ChannelClosedByBroker(404, "NOT_FOUND"),
            rabbitflow.InvalidDestinationError,
        ),
        (pika.exceptions.ChannelClosedByBroker(406, "PRECONDITION_FAILED"), rabbitflow.BrokerError),
        (pika.exceptions.ProbableAuthenticationError("bad"), rabbitflow.BrokerError),
        (
            pika.exceptions.ConnectionClosedByBroker(320, "CONNECTION_FORCED"),
            rabbitflow.ConnectionLostError,
        ),
        (pika.exceptions.StreamLostError("reset"), rabbitflow.ConnectionLostError),
        (pika.exceptions.ChannelWrongStateError("closed"), rabbitflow.ProtocolError),
        (ConnectionResetError(), rabbitflow.ConnectionLostError),
    ],
)
def test_pika_errors_become_rabbitflow_errors(
    error: BaseException, expected: type[rabbitflow.JMSException]
) -> None:
    assert type(translate_error(error)) is expected


def test_broker_reply_code_is_kept() -> None:
    translated = translate_error(pika.exceptions.ChannelClosedByBroker(406, "PRECONDITION_FAILED"))
    assert isinstance(translated, rabbitflow.BrokerError)
    assert translated.reply_code == 406
    assert "PRECONDITION_FAILED" in str(translated)


def test_rabbitflow_errors_pass_through() -> None:
    error = rabbitflow.IllegalStateError("closed")
    assert translate_error(error) is error
