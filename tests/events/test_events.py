"""The gateway's event classes render exactly the SPEC's lines and records."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from rabbitflow_broker.events import (
    ALL_QUEUES,
    EVENT_TYPES,
    ChannelClosed,
    ChannelFlowEnforced,
    ChannelFlowIgnored,
    ChannelFlowRemoved,
    ConnectionClosed,
    QueueOverfull,
    QueueUnderfull,
    StoreOverfull,
    StoreUnderfull,
    event_from_record,
    record_fields,
)

TS = dt.datetime(2026, 11, 22, 5, 0, 0, 123000, tzinfo=dt.UTC)
CHANNEL = {
    "ts": TS,
    "vhost": "/",
    "connection": 7,
    "user": "guest",
    "remote_host": "127.0.0.1",
    "remote_port": 50514,
    "channel": 1,
}


def test_queue_overfull_line_matches_spec() -> None:
    event = QueueOverfull(
        ts=TS,
        vhost="/",
        queue="orders",
        size=1200,
        capacity=1000,
        messages=12,
        message_capacity=900,
    )
    assert event.line() == (
        "[vh(/)/qu(orders)] QUE-1003 : Overfull : Size : 1,200 bytes, Capacity : 1,000, "
        "Messages : 12, Message Capacity : 900"
    )


def test_queue_underfull_line_matches_spec() -> None:
    event = QueueUnderfull(
        ts=TS,
        vhost="/",
        queue="orders",
        size=600,
        resume_capacity=800,
        messages=4,
        message_capacity=500,
    )
    assert event.line() == (
        "[vh(/)/qu(orders)] QUE-1004 : Underfull : Size : 600 bytes, Resume Capacity : 800, "
        "Messages : 4, Message Capacity : 500"
    )


def test_unset_threshold_prints_zero() -> None:
    event = QueueOverfull(
        ts=TS, vhost="/", queue="q", size=0, capacity=0, messages=101, message_capacity=100
    )
    assert "Capacity : 0, Messages : 101, Message Capacity : 100" in event.line()


def test_channel_lines_match_spec() -> None:
    assert ChannelFlowEnforced(**CHANNEL, queue="orders").line() == (
        "[con:7(guest@127.0.0.1:50514/)/ch:1] CHN-1005 : Flow Control Enforced (Queue orders)"
    )
    assert ChannelFlowRemoved(**CHANNEL).line() == (
        "[con:7(guest@127.0.0.1:50514/)/ch:1] CHN-1006 : Flow Control Removed"
    )
    assert ChannelFlowIgnored(**CHANNEL).line() == (
        "[con:7(guest@127.0.0.1:50514/)/ch:1] CHN-1012 : Flow Control Ignored. "
        "Channel will be closed."
    )


def test_store_wide_block_names_all_queues() -> None:
    line = ChannelFlowEnforced(**CHANNEL, queue=ALL_QUEUES).line()
    assert line.endswith("CHN-1005 : Flow Control Enforced (Queue ** All Queues **)")


def test_named_vhost_appears_after_the_port() -> None:
    event = ChannelFlowRemoved(**{**CHANNEL, "vhost": "prod"})
    assert event.subject == "[con:7(guest@127.0.0.1:50514/prod)/ch:1]"


def test_store_lines_match_spec() -> None:
    kwargs = {
        "ts": TS,
        "vhost": "/",
        "size": 2_000_000,
        "overfull_size": 1_000_000,
        "underfull_size": 500_000,
    }
    assert StoreOverfull(**kwargs).line() == (
        "[vh(/)/ms(RabbitMQ)] MST-1008 : Store overfull, flow control will be enforced"
    )
    assert StoreUnderfull(**kwargs).line() == (
        "[vh(/)/ms(RabbitMQ)] MST-1009 : Store overfull condition cleared"
    )


def test_record_has_required_keys_and_subject_fields() -> None:
    record = ChannelFlowEnforced(**CHANNEL, queue="orders").to_record()
    assert record["ts"] == "2026-11-22T05:00:00.123Z"
    assert record["code"] == "CHN-1005"
    assert record["subject"] == "[con:7(guest@127.0.0.1:50514/)/ch:1]"
    assert record["message"] == "Flow Control Enforced (Queue orders)"
    assert record["vhost"] == "/"
    assert record["connection"] == 7
    assert record["channel"] == 1
    assert record["queue"] == "orders"
    json.dumps(record)  # JSON-able as is


def test_channel_close_line_matches_broker_j() -> None:
    assert (
        ChannelClosed(**CHANNEL).line() == "[con:7(guest@127.0.0.1:50514/)/ch:1] CHN-1003 : Close"
    )


def test_connection_close_line_matches_broker_j() -> None:
    event = ConnectionClosed(**{k: v for k, v in CHANNEL.items() if k != "channel"})
    assert event.line() == "[con:7(guest@127.0.0.1:50514/)] CON-1002 : Close"


@pytest.mark.parametrize("code", sorted(EVENT_TYPES))
def test_every_record_round_trips(code: str) -> None:
    samples = {
        "QUE-1003": QueueOverfull(
            ts=TS, vhost="/", queue="q", size=1, capacity=2, messages=3, message_capacity=4
        ),
        "QUE-1004": QueueUnderfull(
            ts=TS, vhost="/", queue="q", size=1, resume_capacity=2, messages=3, message_capacity=4
        ),
        "CHN-1005": ChannelFlowEnforced(**CHANNEL, queue="q"),
        "CHN-1006": ChannelFlowRemoved(**CHANNEL),
        "CHN-1012": ChannelFlowIgnored(**CHANNEL),
        "CHN-1003": ChannelClosed(**CHANNEL),
        "CON-1002": ConnectionClosed(**{k: v for k, v in CHANNEL.items() if k != "channel"}),
        "MST-1008": StoreOverfull(ts=TS, vhost="/", size=3, overfull_size=2, underfull_size=1),
        "MST-1009": StoreUnderfull(ts=TS, vhost="/", size=0, overfull_size=2, underfull_size=1),
    }
    event = samples[code]
    record = json.loads(json.dumps(event.to_record()))
    assert event_from_record(record) == event


def test_record_fields_cover_every_record_key() -> None:
    fields = record_fields()
    sample = QueueOverfull(
        ts=TS, vhost="/", queue="q", size=1, capacity=2, messages=3, message_capacity=4
    ).to_record()
    assert set(sample) <= set(fields)
    assert fields["ts"] is dt.datetime
    assert fields["size"] is int
    assert fields["queue"] is str


def test_unknown_code_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event code 'XYZ-1'"):
        event_from_record({"code": "XYZ-1", "ts": "2026-11-22T05:00:00Z"})


def test_missing_field_is_named() -> None:
    with pytest.raises(ValueError, match="lacks field 'queue'"):
        event_from_record({"code": "QUE-1003", "ts": "2026-11-22T05:00:00Z", "vhost": "/"})


def test_named_vhost_is_spelt_with_a_slash_in_queue_subjects() -> None:
    event = QueueUnderfull(
        ts=TS,
        vhost="billing",
        queue="orders",
        size=0,
        resume_capacity=0,
        messages=0,
        message_capacity=5,
    )
    assert event.subject == "[vh(/billing)/qu(orders)]"
    assert event.to_record()["vhost"] == "billing"


def test_named_vhost_is_spelt_with_a_slash_in_store_subjects() -> None:
    event = StoreOverfull(ts=TS, vhost="billing", size=2, overfull_size=1, underfull_size=1)
    assert event.subject == "[vh(/billing)/ms(RabbitMQ)]"


def test_queue_and_channel_subjects_spell_a_named_vhost_alike() -> None:
    queue = QueueOverfull(
        ts=TS,
        vhost="billing",
        queue="orders",
        size=0,
        capacity=0,
        messages=6,
        message_capacity=5,
    )
    channel = ChannelFlowRemoved(**{**CHANNEL, "vhost": "billing"})
    assert queue.subject.startswith("[vh(/billing)/")
    assert channel.subject == "[con:7(guest@127.0.0.1:50514/billing)/ch:1]"
