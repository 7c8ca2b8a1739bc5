"""Frame splitting, content order checks and the hand decoders."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.body import ContentBody

from rabbitflow_broker.frames import (
    FRAME_ERROR,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
    ContentTracker,
    FrameError,
    FrameReader,
    decode_ack,
    decode_content_header,
    decode_deliver,
    decode_method,
    decode_publish,
    encode_method,
    method_id,
    whole_message,
)


def _publish_frames(body: bytes, headers: dict[str, object] | None = None) -> bytes:
    from pamqp.commands import Basic

    props = Basic.Properties(headers=headers) if headers else Basic.Properties()
    return (
        encode_method(1, Basic.Publish(exchange="ex", routing_key="rk", mandatory=True))
        + pamqp_frame.marshal(pamqp_header.ContentHeader(0, len(body), props), 1)
        + pamqp_frame.marshal(ContentBody(body), 1)
    )


def test_protocol_header_is_reported_first() -> None:
    reader = FrameReader(expect_protocol_header=True)
    _buffer, frames = reader.feed(PROTOCOL_HEADER)
    assert [(f.kind, f.start, f.end) for f in frames] == [(0, 0, 8)]


def test_wrong_protocol_header_is_code_zero() -> None:
    reader = FrameReader(expect_protocol_header=True)
    with pytest.raises(FrameError) as caught:
        reader.feed(b"AMQP\x01\x01\x00\x0a")
    assert caught.value.code == 0


def test_frames_split_across_chunks_come_out_whole() -> None:
    data = _publish_frames(b"hello")
    reader = FrameReader()
    seen = []
    for i in range(len(data)):
        buffer, frames = reader.feed(data[i : i + 1])
        seen.extend(buffer[f.start : f.end] for f in frames)
    assert b"".join(seen) == data
    assert len(seen) == 3


def test_offsets_point_at_original_bytes() -> None:
    data = _publish_frames(b"abc") * 2
    buffer, frames = FrameReader().feed(data)
    assert b"".join(buffer[f.start : f.end] for f in frames) == data


def test_missing_end_octet_is_frame_error() -> None:
    bad = struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0b" + b"\x00"
    with pytest.raises(FrameError) as caught:
        FrameReader().feed(bad)
    assert caught.value.code == FRAME_ERROR


def test_oversized_frame_is_frame_error() -> None:
    reader = FrameReader()
    reader.max_frame_size = 10
    with pytest.raises(FrameError, match="exceeds frame-max"):
        reader.feed(struct.pack(">BHI", 3, 1, 11))


def test_unknown_frame_type_is_frame_error() -> None:
    with pytest.raises(FrameError, match="unknown frame type"):
        FrameReader().feed(struct.pack(">BHI", 9, 0, 0) + b"\xce")


def test_publish_decoder_matches_pamqp() -> None:
    data = _publish_frames(b"")
    buffer, frames = FrameReader().feed(data)
    assert method_id(buffer, frames[0]) == (60, 40)
    got = decode_publish(frames[0].payload(buffer))
    assert (got.exchange, got.routing_key, got.mandatory) == ("ex", "rk", True)


def test_deliver_decoder_reads_tag() -> None:
    raw = encode_method(1, commands.Basic.Deliver("ctag", 42, False, "ex", "rk"))
    buffer, frames = FrameReader().feed(raw)
    got = decode_deliver(frames[0].payload(buffer))
    assert (got.consumer_tag, got.delivery_tag) == ("ctag", 42)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (commands.Basic.Ack(7, True), (7, True, False)),
        (commands.Basic.Nack(7, False, True), (7, False, True)),
        (commands.Basic.Reject(7, False), (7, False, False)),
    ],
    ids=["ack", "nack", "reject"],
)
def test_ack_decoder(method: object, expected: tuple[int, bool, bool]) -> None:
    buffer, frames = FrameReader().feed(encode_method(1, method))  # type: ignore[arg-type]
    ids = method_id(buffer, frames[0])
    assert tuple(decode_ack(frames[0].payload(buffer), ids)) == expected


def test_content_header_gives_size_and_headers_when_asked() -> None:
    buffer, frames = FrameReader().feed(_publish_frames(b"12345", {"CC": ["a"]}))
    payload = frames[1].payload(buffer)
    assert decode_content_header(payload, want_headers=False).headers is None
    info = decode_content_header(payload, want_headers=True)
    assert info.body_size == 5
    assert info.headers == {"CC": ["a"]}


def test_decode_method_unknown_index_is_command_invalid() -> None:
    with pytest.raises(FrameError) as caught:
        decode_method(b"\x00\x99\x00\x01")
    assert caught.value.code == 503


def test_content_header_without_method_is_unexpected() -> None:
    with pytest.raises(FrameError) as caught:
        ContentTracker().header(1, 5)
    assert caught.value.code == UNEXPECTED_FRAME


def test_method_inside_content_is_unexpected() -> None:
    tracker = ContentTracker()
    tracker.method(1, (60, 40))
    with pytest.raises(FrameError) as caught:
        tracker.method(1, (60, 40))
    assert caught.value.code == UNEXPECTED_FRAME


def test_content_completes_after_announced_body_size() -> None:
    tracker = ContentTracker()
    tracker.method(1, (60, 60))
    assert tracker.header(1, 10) is False
    assert tracker.mid_content(1)
    assert tracker.body(1, 4) is False
    assert tracker.body(1, 6) is True
    assert not tracker.mid_content(1)


def test_body_longer_than_announced_is_frame_error() -> None:
    tracker = ContentTracker()
    tracker.method(1, (60, 40))
    tracker.header(1, 3)
    with pytest.raises(FrameError) as caught:
        tracker.body(1, 4)
    assert caught.value.code == FRAME_ERROR


def test_other_channels_may_interleave() -> None:
    tracker = ContentTracker()
    tracker.method(1, (60, 40))
    tracker.method(2, (20, 10))
    assert not tracker.mid_content(2)


def test_whole_message_gives_the_body_size_of_a_complete_message() -> None:
    buffer, frames = FrameReader().feed(_publish_frames(b"x" * 300))
    assert whole_message(buffer, frames, 0) == 300


def _split_body_publish(body: bytes) -> bytes:
    half = len(body) // 2
    return (
        _publish_frames(body).rsplit(pamqp_frame.marshal(ContentBody(body), 1), 1)[0]
        + pamqp_frame.marshal(ContentBody(body[:half]), 1)
        + pamqp_frame.marshal(ContentBody(body[half:]), 1)
    )


def _other_channel_body(body: bytes) -> bytes:
    return _publish_frames(body).rsplit(pamqp_frame.marshal(ContentBody(body), 1), 1)[
        0
    ] + pamqp_frame.marshal(ContentBody(body), 2)


@pytest.mark.parametrize(
    ("data", "index"),
    [
        (_publish_frames(b""), 0),  # empty body: no body frame
        (_split_body_publish(b"0123456789"), 0),  # body in two frames
        (_publish_frames(b"x" * 10)[:-12], 0),  # body not read yet
        (_other_channel_body(b"x" * 10), 0),  # body on another channel
        (_publish_frames(b"x" * 10), 1),  # not at a method
    ],
    ids=["empty", "split-body", "incomplete", "other-channel", "not-a-method"],
)
def test_whole_message_leaves_anything_unusual_to_the_frame_path(data: bytes, index: int) -> None:
    buffer, frames = FrameReader().feed(data)
    assert whole_message(buffer, frames, index) == -1
