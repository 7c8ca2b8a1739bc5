"""How RabbitMQ answers mutated AMQP frames: a recorded table (generated; do not edit).

Recorded from RabbitMQ 3.10.8 on Erlang 25.2.3 with
``.venv/bin/python -m integration.broker.record_rabbitmq_answers``.

Each case is ``data`` sent at ``phase`` of a new connection:

* ``"header"``: instead of the protocol header;
* ``"start"``: after the protocol header and Connection.Start, instead of Start-Ok;
* ``"tune"``: after Start-Ok (guest/guest, PLAIN) and Connection.Tune, instead of
  Tune-Ok;
* ``"open"``: logged in (Tune-Ok echoing frame-max 131072, heartbeat 0; vhost "/") with
  channel 1 open; the bytes are followed by Basic.Qos(prefetch 0) on channel 1 as a
  sentinel.

``answer`` is what came back first: ``connection.close`` / ``channel.close`` with the
reply code and the class and method ids RabbitMQ named, ``ok`` (the sentinel's Qos-Ok:
the bytes were accepted and no close followed within 0.5 s), ``protocol-header``
(RabbitMQ's own header, then the end), or ``eof`` (the socket closed without a Close
frame; before login RabbitMQ does that after a 3 s delay).  ``text`` is RabbitMQ's
reply text, for reading only.
"""

# Generated data: byte strings and RabbitMQ's reply texts are kept on one line each.
# ruff: noqa: E501

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["header", "start", "tune", "open"]
AnswerKind = Literal["connection.close", "channel.close", "ok", "protocol-header", "eof"]


@dataclass(frozen=True)
class RabbitMQAnswer:
    """The first answer: kind, reply code, class id, method id (text: informative)."""

    kind: AnswerKind
    code: int = 0
    class_id: int = 0
    method_id: int = 0
    text: str = ""


@dataclass(frozen=True)
class RecordedCase:
    """``data`` sent at ``phase``; ``answer`` is what RabbitMQ did."""

    name: str
    description: str
    phase: Phase
    data: bytes
    answer: RabbitMQAnswer


CASES: tuple[RecordedCase, ...] = (
    RecordedCase(
        name="bad protocol header",
        description="AMQP 0-9-2 instead of 0-9-1",
        phase="header",
        data=bytes.fromhex("414d515000000902"),
        answer=RabbitMQAnswer("protocol-header", 0, 0, 0, "414d515000000901"),
    ),
    RecordedCase(
        name="start-ok larger than 4096",
        description="a 7.5 KB Connection.Start-Ok (1,500 client properties) before Tune-Ok",
        phase="start",
        data=bytes.fromhex("01000000001794000a000b00001770")
        + bytes.fromhex("016b7401") * 1500
        + bytes.fromhex("05504c41494e0000000c00677565737400677565737405656e5f5553ce"),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="frame header claiming 928 KB before tune",
        description="only the header of a 928,000-byte method frame, then 100 bytes",
        phase="start",
        data=bytes.fromhex("010000000e29") + bytes.fromhex("00") * 101,
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="channel method on channel 0 before login",
        description="Channel.Open on channel 0 instead of Start-Ok",
        phase="start",
        data=bytes.fromhex("010000000000050014000a00ce"),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="bad frame end before login",
        description="Start-Ok ending with 0x00 instead of 0xCE",
        phase="start",
        data=bytes.fromhex(
            "01000000000024000a000b0000000005504c41494e0000000c00677565737400677565737405656e5f555300"
        ),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="tune-ok frame larger than 4096",
        description="a 5,000-byte method frame instead of Tune-Ok",
        phase="tune",
        data=bytes.fromhex("01000000001388000a001f")
        + bytes.fromhex("00") * 4996
        + bytes.fromhex("ce"),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="bad frame end",
        description="Basic.Qos whose frame ends with 0x00",
        phase="open",
        data=bytes.fromhex("0100010000000b003c000a0000000000000000"),
        answer=RabbitMQAnswer(
            "connection.close",
            501,
            0,
            0,
            "FRAME_ERROR - type 1, all octets = <<0,60,0,10,0,0,0,0,0,0,0>>: {invalid_frame_end_marker,0}",
        ),
    ),
    RecordedCase(
        name="unknown frame type",
        description="frame type 9 on channel 1",
        phase="open",
        data=bytes.fromhex("090001000000020000ce"),
        answer=RabbitMQAnswer(
            "connection.close",
            501,
            0,
            0,
            "FRAME_ERROR - type 9, all octets = <<0,0>>: unknown_frame",
        ),
    ),
    RecordedCase(
        name="frame larger than frame-max",
        description="a body frame header claiming frame-max + 1 bytes",
        phase="open",
        data=bytes.fromhex("03000100020001") + bytes.fromhex("00") * 64,
        answer=RabbitMQAnswer(
            "connection.close",
            501,
            0,
            0,
            "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,131073,131064}",
        ),
    ),
    RecordedCase(
        name="frame length shorter than its method ids",
        description="a method frame of 2 bytes on channel 1",
        phase="open",
        data=bytes.fromhex("01000100000002003cce"),
        answer=RabbitMQAnswer(
            "connection.close",
            501,
            0,
            0,
            "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame",
        ),
    ),
    RecordedCase(
        name="unknown class",
        description="method 999.10 on channel 1",
        phase="open",
        data=bytes.fromhex("0100010000000403e7000ace"),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="unknown method",
        description="method 60.999 (Basic) on channel 1",
        phase="open",
        data=bytes.fromhex("01000100000004003c03e7ce"),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="truncated arguments",
        description="Queue.Declare cut inside its queue name",
        phase="open",
        data=bytes.fromhex("0100010000000a0032000a000014616263ce"),
        answer=RabbitMQAnswer(
            "connection.close", 501, 50, 10, "FRAME_ERROR - cannot decode <<0,0,20,97,98,99>>"
        ),
    ),
    RecordedCase(
        name="table length beyond the frame",
        description="Queue.Declare whose arguments table claims 0xFFFFFF00 bytes",
        phase="open",
        data=bytes.fromhex(
            "010001000000240032000a00001872662d616e73776572732d6e6f2d737563682d717565756501ffffff00ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            501,
            50,
            10,
            "FRAME_ERROR - cannot decode <<0,0,24,114,102,45,97,110,115,119,101,114,115,45,110,111,45,115,117,99,104,45,113,117,101,117,101,1,255,255,255,0>>",
        ),
    ),
    RecordedCase(
        name="unknown field type in a table",
        description="Queue.Declare(passive) whose arguments table holds a value of type 'Q'",
        phase="open",
        data=bytes.fromhex(
            "010001000000280032000a00001872662d616e73776572732d6e6f2d737563682d7175657565010000000401785100ce"
        ),
        answer=RabbitMQAnswer("eof", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="huge valid table",
        description="Queue.Declare(passive) of a missing queue with 24,000 table entries (120 KB)",
        phase="open",
        data=bytes.fromhex(
            "010001000177240032000a00001872662d616e73776572732d6e6f2d737563682d71756575650100017700"
        )
        + bytes.fromhex("016b6201") * 24000
        + bytes.fromhex("ce"),
        answer=RabbitMQAnswer(
            "channel.close",
            404,
            50,
            10,
            "NOT_FOUND - no queue 'rf-answers-no-such-queue' in vhost '/'",
        ),
    ),
    RecordedCase(
        name="method on a closed channel",
        description="Queue.Declare on channel 5, never opened",
        phase="open",
        data=bytes.fromhex(
            "010005000000240032000a00001872662d616e73776572732d6e6f2d737563682d71756575650100000000ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close", 504, 50, 10, "CHANNEL_ERROR - expected 'channel.open'"
        ),
    ),
    RecordedCase(
        name="channel method on channel 0",
        description="Channel.Open on channel 0",
        phase="open",
        data=bytes.fromhex("010000000000050014000a00ce"),
        answer=RabbitMQAnswer(
            "connection.close",
            504,
            20,
            10,
            "CHANNEL_ERROR - unexpected method in connection state running",
        ),
    ),
    RecordedCase(
        name="queue method on channel 0",
        description="Queue.Declare(passive) on channel 0",
        phase="open",
        data=bytes.fromhex(
            "010000000000240032000a00001872662d616e73776572732d6e6f2d737563682d71756575650100000000ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            504,
            50,
            10,
            "CHANNEL_ERROR - unexpected method in connection state running",
        ),
    ),
    RecordedCase(
        name="connection method on channel 1",
        description="Connection.Open on channel 1",
        phase="open",
        data=bytes.fromhex("01000100000008000a0028012f0000ce"),
        answer=RabbitMQAnswer(
            "connection.close", 503, 10, 40, "COMMAND_INVALID - unimplemented method"
        ),
    ),
    RecordedCase(
        name="second channel open",
        description="Channel.Open on channel 1, already open",
        phase="open",
        data=bytes.fromhex("010001000000050014000a00ce"),
        answer=RabbitMQAnswer(
            "connection.close", 504, 20, 10, "CHANNEL_ERROR - second 'channel.open' seen"
        ),
    ),
    RecordedCase(
        name="heartbeat on a channel",
        description="a heartbeat frame on channel 1",
        phase="open",
        data=bytes.fromhex("08000100000000ce"),
        answer=RabbitMQAnswer(
            "connection.close", 505, 0, 0, "UNEXPECTED_FRAME - type 8, all octets = <<>>"
        ),
    ),
    RecordedCase(
        name="content header without a method",
        description="a Basic content header on channel 1, no publish before it",
        phase="open",
        data=bytes.fromhex("0200010000000e003c000000000000000000030000ce"),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            0,
            0,
            "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        ),
    ),
    RecordedCase(
        name="body without a header",
        description="Basic.Publish then a body frame, no content header",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            60,
            40,
            "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
        ),
    ),
    RecordedCase(
        name="method inside content",
        description="Basic.Publish then Basic.Qos instead of the content header",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0100010000000b003c000a00000000000000ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            60,
            40,
            "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
        ),
    ),
    RecordedCase(
        name="content header on the wrong channel",
        description="Basic.Publish on channel 1, its content header and body on channel 2 (open)",
        phase="open",
        data=bytes.fromhex(
            "010002000000050014000a00ce01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200020000000e003c000000000000000000030000ce03000200000003616263ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            0,
            0,
            "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        ),
    ),
    RecordedCase(
        name="content header on a closed channel",
        description="Basic.Publish on channel 1, its content header on channel 3 (never opened)",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200030000000e003c000000000000000000030000ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            0,
            0,
            "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        ),
    ),
    RecordedCase(
        name="content header of the wrong class",
        description="Basic.Publish then a content header of class 50 (Queue)",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e0032000000000000000000030000ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            60,
            40,
            "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        ),
    ),
    RecordedCase(
        name="body longer than the header says",
        description="content header body-size 3, body frame of 10 bytes",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e003c000000000000000000030000ce0300010000000a00000000000000000000ce"
        ),
        answer=RabbitMQAnswer(
            "connection.close",
            505,
            60,
            40,
            "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        ),
    ),
    RecordedCase(
        name="property flags continuation bit",
        description="content header with flag bit 0 (continuation) set and no second flag word",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e003c000000000000000000030001ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer("ok", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="properties shorter than their flags",
        description="content header announcing content-type and headers, with no property bytes",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e003c00000000000000000003a000ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer("connection.close", 541, 0, 0, "INTERNAL_ERROR"),
    ),
    RecordedCase(
        name="publish to a missing exchange",
        description="Basic.Publish to exchange rf-answers-no-such-exchange",
        phase="open",
        data=bytes.fromhex(
            "01000100000025003c002800001b72662d616e73776572732d6e6f2d737563682d65786368616e6765016b00ce0200010000000e003c000000000000000000030000ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer(
            "channel.close",
            404,
            60,
            40,
            "NOT_FOUND - no exchange 'rf-answers-no-such-exchange' in vhost '/'",
        ),
    ),
    RecordedCase(
        name="commit without select",
        description="Tx.Commit on a channel never put in tx mode",
        phase="open",
        data=bytes.fromhex("01000100000004005a0014ce"),
        answer=RabbitMQAnswer(
            "channel.close", 406, 90, 20, "PRECONDITION_FAILED - channel is not transactional"
        ),
    ),
    RecordedCase(
        name="confirm select after tx select",
        description="Tx.Select then Confirm.Select on channel 1",
        phase="open",
        data=bytes.fromhex("01000100000004005a000ace010001000000050055000a00ce"),
        answer=RabbitMQAnswer(
            "channel.close",
            406,
            85,
            10,
            "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
        ),
    ),
    RecordedCase(
        name="ack of an unknown delivery tag",
        description="Basic.Ack delivery-tag 42 on a channel that received nothing",
        phase="open",
        data=bytes.fromhex("0100010000000d003c0050000000000000002a00ce"),
        answer=RabbitMQAnswer(
            "channel.close", 406, 60, 80, "PRECONDITION_FAILED - unknown delivery tag 42"
        ),
    ),
    RecordedCase(
        name="publish of an empty message",
        description="Basic.Publish with body-size 0 and no body frame (valid)",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e003c000000000000000000000000ce"
        ),
        answer=RabbitMQAnswer("ok", 0, 0, 0, ""),
    ),
    RecordedCase(
        name="publish to the default exchange",
        description="a 3-byte message to an unbound routing key (valid, dropped by RabbitMQ)",
        phase="open",
        data=bytes.fromhex(
            "01000100000021003c00280000001872662d616e73776572732d6e6f2d737563682d717565756500ce0200010000000e003c000000000000000000030000ce03000100000003616263ce"
        ),
        answer=RabbitMQAnswer("ok", 0, 0, 0, ""),
    ),
)

BY_NAME: dict[str, RecordedCase] = {case.name: case for case in CASES}
