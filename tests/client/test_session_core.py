"""What both sessions share: the declarations recovery repeats, the message
for a delivery, and the refusal to acknowledge a message of a lost channel."""

from __future__ import annotations

import pytest

import rabbitflow
from rabbitflow._message import WireProperties
from rabbitflow._session_core import (
    Declaration,
    Declarations,
    Declared,
    check_current,
    delivered_message,
)
from rabbitflow._transport_base import Delivery


def test_declarations_keep_their_order_once_each_and_forget_a_deleted_subscription() -> None:
    declared = Declarations()
    declared.record(Declared.QUEUE, "orders")
    declared.record(Declared.TOPIC, "prices")
    declared.record(Declared.SUBSCRIPTION, "prices", "audit")
    declared.record(Declared.QUEUE, "orders")
    assert declared.snapshot() == [
        Declaration(Declared.QUEUE, "orders"),
        Declaration(Declared.TOPIC, "prices"),
        Declaration(Declared.SUBSCRIPTION, "prices", "audit"),
    ]
    declared.forget_subscription("audit")
    assert [d.kind for d in declared.snapshot()] == [Declared.QUEUE, Declared.TOPIC]


def test_replaying_declarations_calls_each_kind_in_the_order_made() -> None:
    declared = Declarations()
    declared.record(Declared.TOPIC, "prices")
    declared.record(Declared.SUBSCRIPTION, "prices", "audit")
    declared.record(Declared.QUEUE, "orders")
    calls = declared.replay(
        queue=lambda name: ("queue", name),
        topic=lambda name: ("topic", name),
        subscription=lambda topic, name: ("subscription", topic.name, name),
    )
    assert [call() for call in calls] == [
        ("topic", "prices"),
        ("subscription", "prices", "audit"),
        ("queue", "orders"),
    ]


def test_a_delivered_message_acknowledges_through_the_given_acknowledger() -> None:
    acks: list[str] = []
    delivery = Delivery(7, True, "", "orders", b"hi", WireProperties(content_type="text/plain"))
    message = delivered_message(delivery, rabbitflow.Queue("orders"), lambda: acks.append("ack"))
    assert message.text == "hi"  # type: ignore[attr-defined]
    assert message.redelivered
    message.acknowledge()
    assert acks == ["ack"]


def test_a_message_of_a_lost_channel_cannot_be_acknowledged() -> None:
    check_current(3, 3)
    with pytest.raises(rabbitflow.StaleMessageError):
        check_current(2, 3)
