"""Record how RabbitMQ answers mutated AMQP frames into ``tests/broker/rabbitmq_answers.py``.

Each case is a byte string sent at one point of a connection (see
``Phase`` in the table module); the answer is the first close (code,
class id, method id), the sentinel's reply when the bytes were accepted, or
the end of the connection.  The table is data the gateway engine's unit
fuzzer checks itself against; ``integration/broker/test_error_codes.py``
checks that RabbitMQ still answers as recorded and that the gateway answers
the same.

Re-record (only when the cases or the RabbitMQ version change):

    .venv/bin/python -m integration.broker.record_rabbitmq_answers [--url URL]
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from integration.broker._raw_amqp import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    Answer,
    RawConnection,
    content_header,
    frame,
    longstr,
    method,
    publish,
    qos_sentinel,
    shortstr,
    table,
    u8,
    u16,
    u32,
    u64,
)

TABLE = Path(__file__).resolve().parents[2] / "tests" / "broker" / "rabbitmq_answers.py"

#: Where the case's bytes are sent (values of ``Phase`` in the table module).
HEADER, START, TUNE, OPEN = "header", "start", "tune", "open"

#: The queue the "open" cases may name; declared by no one (a passive declare fails 404).
_NO_QUEUE = b"rf-answers-no-such-queue"


def _declare(channel: int, name: bytes, arguments: bytes, *, passive: bool = False) -> bytes:
    flags = 0x01 if passive else 0x00
    return method(channel, 50, 10, u16(0) + shortstr(name) + u8(flags) + arguments)


def _publish_message(channel: int, body: bytes) -> bytes:
    return (
        publish(channel, b"", _NO_QUEUE)
        + content_header(channel, len(body), 0, b"")
        + frame(FRAME_BODY, channel, body)
    )


#: name -> (phase, description, bytes).  Sent on a connection in that phase; for
#: "open" the connection is logged in with channel 1 open, and a Basic.Qos on
#: channel 1 follows the bytes as the sentinel.
CASES: dict[str, tuple[str, str, bytes]] = {
    # -- before login ----------------------------------------------------------------------
    "bad protocol header": (HEADER, "AMQP 0-9-2 instead of 0-9-1", b"AMQP\x00\x00\x09\x02"),
    "start-ok larger than 4096": (
        START,
        "a 7.5 KB Connection.Start-Ok (1,500 client properties) before Tune-Ok",
        RawConnection.start_ok(client_properties=table([(b"k", b"t\x01")] * 1500)),
    ),
    "frame header claiming 928 KB before tune": (
        START,
        "only the header of a 928,000-byte method frame, then 100 bytes",
        struct.pack(">BHI", FRAME_METHOD, 0, 928_000) + bytes(100),
    ),
    "channel method on channel 0 before login": (
        START,
        "Channel.Open on channel 0 instead of Start-Ok",
        method(0, 20, 10, shortstr(b"")),
    ),
    "bad frame end before login": (
        START,
        "Start-Ok ending with 0x00 instead of 0xCE",
        RawConnection.start_ok()[:-1] + b"\x00",
    ),
    "tune-ok frame larger than 4096": (
        TUNE,
        "a 5,000-byte method frame instead of Tune-Ok",
        frame(FRAME_METHOD, 0, u16(10) + u16(31) + bytes(4996)),
    ),
    # -- after login, channel 1 open -----------------------------------------------------------
    "bad frame end": (
        OPEN,
        "Basic.Qos whose frame ends with 0x00",
        method(1, 60, 10, u32(0) + u16(0) + u8(0))[:-1] + b"\x00",
    ),
    "unknown frame type": (OPEN, "frame type 9 on channel 1", frame(9, 1, b"\x00\x00")),
    "frame larger than frame-max": (
        OPEN,
        "a body frame header claiming frame-max + 1 bytes",
        struct.pack(">BHI", FRAME_BODY, 1, 131_073) + bytes(64),
    ),
    "frame length shorter than its method ids": (
        OPEN,
        "a method frame of 2 bytes on channel 1",
        frame(FRAME_METHOD, 1, u16(60)),
    ),
    "unknown class": (OPEN, "method 999.10 on channel 1", method(1, 999, 10)),
    "unknown method": (OPEN, "method 60.999 (Basic) on channel 1", method(1, 60, 999)),
    "truncated arguments": (
        OPEN,
        "Queue.Declare cut inside its queue name",
        method(1, 50, 10, u16(0) + u8(20) + b"abc"),
    ),
    "table length beyond the frame": (
        OPEN,
        "Queue.Declare whose arguments table claims 0xFFFFFF00 bytes",
        method(1, 50, 10, u16(0) + shortstr(_NO_QUEUE) + u8(0x01) + u32(0xFFFFFF00)),
    ),
    "unknown field type in a table": (
        OPEN,
        "Queue.Declare(passive) whose arguments table holds a value of type 'Q'",
        _declare(1, _NO_QUEUE, longstr(shortstr(b"x") + b"Q\x00"), passive=True),
    ),
    "huge valid table": (
        OPEN,
        "Queue.Declare(passive) of a missing queue with 24,000 table entries (120 KB)",
        _declare(1, _NO_QUEUE, table([(b"k", b"b\x01")] * 24_000), passive=True),
    ),
    "method on a closed channel": (
        OPEN,
        "Queue.Declare on channel 5, never opened",
        _declare(5, _NO_QUEUE, table([]), passive=True),
    ),
    "channel method on channel 0": (
        OPEN,
        "Channel.Open on channel 0",
        method(0, 20, 10, shortstr(b"")),
    ),
    "queue method on channel 0": (
        OPEN,
        "Queue.Declare(passive) on channel 0",
        _declare(0, _NO_QUEUE, table([]), passive=True),
    ),
    "connection method on channel 1": (
        OPEN,
        "Connection.Open on channel 1",
        method(1, 10, 40, shortstr(b"/") + shortstr(b"") + u8(0)),
    ),
    "second channel open": (
        OPEN,
        "Channel.Open on channel 1, already open",
        method(1, 20, 10, shortstr(b"")),
    ),
    "heartbeat on a channel": (
        OPEN,
        "a heartbeat frame on channel 1",
        frame(FRAME_HEARTBEAT, 1, b""),
    ),
    "content header without a method": (
        OPEN,
        "a Basic content header on channel 1, no publish before it",
        content_header(1, 3, 0, b""),
    ),
    "body without a header": (
        OPEN,
        "Basic.Publish then a body frame, no content header",
        publish(1, b"", _NO_QUEUE) + frame(FRAME_BODY, 1, b"abc"),
    ),
    "method inside content": (
        OPEN,
        "Basic.Publish then Basic.Qos instead of the content header",
        publish(1, b"", _NO_QUEUE) + method(1, 60, 10, u32(0) + u16(0) + u8(0)),
    ),
    "content header on the wrong channel": (
        OPEN,
        "Basic.Publish on channel 1, its content header and body on channel 2 (open)",
        method(2, 20, 10, shortstr(b""))
        + publish(1, b"", _NO_QUEUE)
        + content_header(2, 3, 0, b"")
        + frame(FRAME_BODY, 2, b"abc"),
    ),
    "content header on a closed channel": (
        OPEN,
        "Basic.Publish on channel 1, its content header on channel 3 (never opened)",
        publish(1, b"", _NO_QUEUE) + content_header(3, 3, 0, b""),
    ),
    "content header of the wrong class": (
        OPEN,
        "Basic.Publish then a content header of class 50 (Queue)",
        publish(1, b"", _NO_QUEUE)
        + frame(FRAME_HEADER, 1, u16(50) + u16(0) + u64(3) + u16(0))
        + frame(FRAME_BODY, 1, b"abc"),
    ),
    "body longer than the header says": (
        OPEN,
        "content header body-size 3, body frame of 10 bytes",
        publish(1, b"", _NO_QUEUE) + content_header(1, 3, 0, b"") + frame(FRAME_BODY, 1, bytes(10)),
    ),
    "property flags continuation bit": (
        OPEN,
        "content header with flag bit 0 (continuation) set and no second flag word",
        publish(1, b"", _NO_QUEUE)
        + content_header(1, 3, 0x0001, b"")
        + frame(FRAME_BODY, 1, b"abc"),
    ),
    "properties shorter than their flags": (
        OPEN,
        "content header announcing content-type and headers, with no property bytes",
        publish(1, b"", _NO_QUEUE)
        + content_header(1, 3, 0xA000, b"")
        + frame(FRAME_BODY, 1, b"abc"),
    ),
    "publish to a missing exchange": (
        OPEN,
        "Basic.Publish to exchange rf-answers-no-such-exchange",
        publish(1, b"rf-answers-no-such-exchange", b"k")
        + content_header(1, 3, 0, b"")
        + frame(FRAME_BODY, 1, b"abc"),
    ),
    "commit without select": (
        OPEN,
        "Tx.Commit on a channel never put in tx mode",
        method(1, 90, 20),
    ),
    "confirm select after tx select": (
        OPEN,
        "Tx.Select then Confirm.Select on channel 1",
        method(1, 90, 10) + method(1, 85, 10, u8(0)),
    ),
    "ack of an unknown delivery tag": (
        OPEN,
        "Basic.Ack delivery-tag 42 on a channel that received nothing",
        method(1, 60, 80, u64(42) + u8(0)),
    ),
    "publish of an empty message": (
        OPEN,
        "Basic.Publish with body-size 0 and no body frame (valid)",
        publish(1, b"", _NO_QUEUE) + content_header(1, 0, 0, b""),
    ),
    "publish to the default exchange": (
        OPEN,
        "a 3-byte message to an unbound routing key (valid, dropped by RabbitMQ)",
        _publish_message(1, b"abc"),
    ),
}


def record_one(host: str, port: int, phase: str, data: bytes, *, timeout: float = 10.0) -> Answer:
    """Send one case's bytes at ``phase`` of a new connection; return the answer."""
    with RawConnection(host, port, timeout=timeout) as connection:
        if phase == HEADER:
            connection.send(data)
            return connection.protocol_answer(timeout=timeout)
        connection.start(timeout=timeout)
        if phase == TUNE:
            connection.tune(timeout=timeout)
        if phase == OPEN:
            connection.tune(timeout=timeout)
            connection.open(timeout=timeout)
            connection.open_channel(1, timeout=timeout)
            connection.send(data + qos_sentinel(1))
            return connection.answer(timeout=timeout, sentinel_channel=1)
        connection.send(data)
        return connection.answer(timeout=timeout)


def _rabbitmq_version(management_url: str) -> str:
    import base64
    import json
    import urllib.request

    request = urllib.request.Request(management_url.rstrip("/") + "/api/overview")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        overview = json.load(response)
    return f"RabbitMQ {overview['rabbitmq_version']} on Erlang {overview['erlang_version']}"


def _render(answers: dict[str, Answer], version: str) -> str:
    lines = [
        '"""How RabbitMQ answers mutated AMQP frames: a recorded table (generated; do not edit).',
        "",
        f"Recorded from {version} with",
        "``.venv/bin/python -m integration.broker.record_rabbitmq_answers``.",
        "",
        "Each case is ``data`` sent at ``phase`` of a new connection:",
        "",
        '* ``"header"``: instead of the protocol header;',
        '* ``"start"``: after the protocol header and Connection.Start, instead of Start-Ok;',
        '* ``"tune"``: after Start-Ok (guest/guest, PLAIN) and Connection.Tune, instead of',
        "  Tune-Ok;",
        '* ``"open"``: logged in (Tune-Ok echoing frame-max 131072, heartbeat 0; vhost "/") with',
        "  channel 1 open; the bytes are followed by Basic.Qos(prefetch 0) on channel 1 as a",
        "  sentinel.",
        "",
        "``answer`` is what came back first: ``connection.close`` / ``channel.close`` with the",
        "reply code and the class and method ids RabbitMQ named, ``ok`` (the sentinel's Qos-Ok:",
        "the bytes were accepted and no close followed within 0.5 s), ``protocol-header``",
        "(RabbitMQ's own header, then the end), or ``eof`` (the socket closed without a Close",
        "frame; before login RabbitMQ does that after a 3 s delay).  ``text`` is RabbitMQ's",
        "reply text, for reading only.",
        '"""',
        "",
        "# Generated data: byte strings and RabbitMQ's reply texts are kept on one line each.",
        "# ruff: noqa: E501",
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "from typing import Literal",
        "",
        'Phase = Literal["header", "start", "tune", "open"]',
        'AnswerKind = Literal["connection.close", "channel.close", "ok", "protocol-header", "eof"]',
        "",
        "",
        "@dataclass(frozen=True)",
        "class RabbitMQAnswer:",
        '    """The first answer: kind, reply code, class id, method id (text: informative)."""',
        "",
        "    kind: AnswerKind",
        "    code: int = 0",
        "    class_id: int = 0",
        "    method_id: int = 0",
        '    text: str = ""',
        "",
        "",
        "@dataclass(frozen=True)",
        "class RecordedCase:",
        '    """``data`` sent at ``phase``; ``answer`` is what RabbitMQ did."""',
        "",
        "    name: str",
        "    description: str",
        "    phase: Phase",
        "    data: bytes",
        "    answer: RabbitMQAnswer",
        "",
        "",
        "CASES: tuple[RecordedCase, ...] = (",
    ]
    for name, (phase, description, data) in CASES.items():
        answer = answers[name]
        lines += [
            "    RecordedCase(",
            f"        name={name!r},",
            f"        description={description!r},",
            f"        phase={phase!r},",
            f"        data={_bytes_literal(data)},",
            f"        answer=RabbitMQAnswer({answer.kind!r}, {answer.code}, {answer.class_id}, "
            f"{answer.method_id}, {answer.text!r}),",
            "    ),",
        ]
    lines += [")", "", "BY_NAME: dict[str, RecordedCase] = {case.name: case for case in CASES}", ""]
    return "\n".join(lines)


def _bytes_literal(data: bytes) -> str:
    """A Python expression for ``data``: hex literals, with any run of 64 bytes or more
    that repeats a unit of up to 16 bytes written as ``bytes.fromhex(unit) * n``."""
    parts: list[str] = []
    literal_start = pos = 0
    while pos < len(data):
        best_unit, best_reps = 0, 0
        for unit in range(1, 17):
            chunk = data[pos : pos + unit]
            reps = 1
            while data[pos + reps * unit : pos + (reps + 1) * unit] == chunk:
                reps += 1
            if reps * unit >= 64 and reps * unit > best_reps * best_unit:
                best_unit, best_reps = unit, reps
        if not best_unit:
            pos += 1
            continue
        if literal_start < pos:
            parts.append(f'bytes.fromhex("{data[literal_start:pos].hex()}")')
        parts.append(f'bytes.fromhex("{data[pos : pos + best_unit].hex()}") * {best_reps}')
        pos += best_unit * best_reps
        literal_start = pos
    if literal_start < len(data):
        parts.append(f'bytes.fromhex("{data[literal_start:].hex()}")')
    return " + ".join(parts) or 'b""'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    parser.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"),
    )
    args = parser.parse_args(argv)
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    answers: dict[str, Answer] = {}
    for name, (phase, _description, data) in CASES.items():
        answers[name] = record_one(host, port, phase, data)
        print(f"{name:<45} {answers[name]}", flush=True)
    TABLE.write_text(_render(answers, _rabbitmq_version(args.management_url)))
    subprocess.run([sys.executable, "-m", "ruff", "format", str(TABLE)], check=False)
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
