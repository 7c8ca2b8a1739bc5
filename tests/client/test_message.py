import pytest

import rabbitflow
from rabbitflow._message import Message, WireProperties, destination_from_text, new_message_id


def round_trip(message: Message) -> Message:
    return Message.from_wire(
        message.body_bytes(), message.to_wire(), redelivered=False, destination=None
    )


def test_text_message_round_trips_its_body_and_properties() -> None:
    sent = rabbitflow.TextMessage("héllo")
    sent.set_property("region", "eu")
    sent.set_property("count", 2)
    sent.correlation_id = "c-9"
    sent.reply_to = rabbitflow.Queue("replies")
    received = round_trip(sent)
    assert isinstance(received, rabbitflow.TextMessage)
    assert received.text == "héllo"
    assert received.properties == {"region": "eu", "count": 2}
    assert (received.correlation_id, received.reply_to) == ("c-9", rabbitflow.Queue("replies"))


def test_bytes_message_round_trips_its_body() -> None:
    received = round_trip(rabbitflow.BytesMessage(b"\x00\xff"))
    assert isinstance(received, rabbitflow.BytesMessage)
    assert received.data == b"\x00\xff"


def test_timestamp_keeps_milliseconds() -> None:
    sent = rabbitflow.TextMessage("x")
    sent.timestamp = 1_700_000_000_123
    assert round_trip(sent).timestamp == 1_700_000_000_123


def test_expiration_travels_as_a_ttl() -> None:
    sent = rabbitflow.TextMessage("x")
    sent.timestamp, sent.expiration = 1_000_000, 1_005_000
    assert sent.to_wire().expiration == "5000"
    assert round_trip(sent).expiration == 1_005_000


def test_unsupported_property_value_is_refused_naming_the_property() -> None:
    with pytest.raises(rabbitflow.MessageFormatError, match="'when'"):
        rabbitflow.TextMessage("x").set_property("when", object())  # type: ignore[arg-type]
    # No AMQP header type of this client carries a float: refused when set,
    # not when the message is already on its way.
    with pytest.raises(rabbitflow.MessageFormatError, match=r"'ratio'.*got float"):
        rabbitflow.TextMessage("x").set_property("ratio", 0.5)


def test_text_body_must_be_text() -> None:
    with pytest.raises(rabbitflow.MessageFormatError, match="str"):
        rabbitflow.TextMessage(b"bytes")  # type: ignore[arg-type]


def test_undecodable_text_body_is_a_format_error() -> None:
    with pytest.raises(rabbitflow.MessageFormatError, match="decoded"):
        Message.from_wire(
            b"\xff", WireProperties(content_type="text/plain"), redelivered=False, destination=None
        )


def test_message_ids_are_unique_and_jms_shaped() -> None:
    ids = {new_message_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("ID:") and len(i) == 39 for i in ids)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("queue://a", rabbitflow.Queue("a")),
        ("topic://b", rabbitflow.Topic("b")),
        ("plain", rabbitflow.Queue("plain")),
        (None, None),
    ],
)
def test_reply_to_text_is_parsed(text: str | None, expected: object) -> None:
    assert destination_from_text(text) == expected


def test_destination_names_are_validated() -> None:
    with pytest.raises(rabbitflow.InvalidDestinationError, match="queue name"):
        rabbitflow.Queue("")


def test_destinations_print_as_urls() -> None:
    assert (str(rabbitflow.Queue("orders")), str(rabbitflow.Topic("prices"))) == (
        "queue://orders",
        "topic://prices",
    )


def test_acknowledge_without_a_session_is_a_no_op() -> None:
    rabbitflow.TextMessage("x").acknowledge()
