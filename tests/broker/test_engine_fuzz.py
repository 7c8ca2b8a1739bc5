"""Property-based fuzzing of the connection engine (hypothesis).

Random valid conversations, cut into random reads, interleaved with
mutated client frames (bad lengths and end octets, unknown methods,
truncated arguments, wrong channels, huge tables).  Whatever comes in, the
engine never raises, every frame it sends the client is well formed, its
buffers stay within their bounds, and frames it cannot follow go to
RabbitMQ unchanged so that RabbitMQ answers them with its own code
(recorded in :mod:`tests.broker.rabbitmq_answers`).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.engine.connection import PRE_LOGIN_BUFFER, Actions
from tests.broker.engine_harness import START_OK, Wire, deliver, method, publish, wire
from tests.broker.frame_reader import FrameReader
from tests.broker.rabbitmq_answers import CASES, RecordedCase

_FRAME = struct.Struct(">BHI")

_CLIENT_FRAMES = [
    publish(1, "q", b"body"),
    publish(2, "q", b"x" * 300),
    publish(1, "q", b""),
    method(1, commands.Confirm.Select()),
    method(2, commands.Channel.Open()),
    method(2, commands.Channel.Close(200, "", 0, 0)),
    method(1, commands.Channel.CloseOk()),
    method(1, commands.Basic.Ack(delivery_tag=1, multiple=True)),
    method(1, commands.Basic.Nack(delivery_tag=2, requeue=False)),
    method(1, commands.Tx.Select()),
    method(1, commands.Tx.Commit()),
    method(1, commands.Queue.Declare(queue="q", arguments={"qpid.flow_stop_count": 5})),
    method(1, commands.Queue.Bind(queue="q", exchange="amq.direct", routing_key="k")),
    method(1, commands.Basic.Consume(queue="q", consumer_tag="c")),
    method(1, commands.Channel.FlowOk(active=False)),
    b"\x08\x00\x00\x00\x00\x00\x00\xce",
]
_UPSTREAM_FRAMES = [
    method(1, commands.Basic.Ack(delivery_tag=1)),
    method(1, commands.Basic.Ack(delivery_tag=3, multiple=True)),
    method(1, commands.Basic.Nack(delivery_tag=2)),
    method(1, commands.Tx.CommitOk()),
    method(1, commands.Queue.DeclareOk(queue="q", message_count=0, consumer_count=0)),
    method(1, commands.Basic.ConsumeOk(consumer_tag="c")),
    deliver(1, "c", 1, b"abc"),
    method(2, commands.Channel.OpenOk()),
    method(2, commands.Channel.CloseOk()),
    method(1, commands.Channel.Close(406, "PRECONDITION_FAILED", 0, 0)),
]
_HUGE_TABLE = method(
    1, commands.Queue.Declare(queue="big", arguments={f"k{i}": i for i in range(5000)})
)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from([*_CLIENT_FRAMES, _HUGE_TABLE])))
    kind = draw(st.integers(0, 6))
    if kind == 0:  # truncated arguments, length fixed up
        cut = draw(st.integers(8, max(8, len(frame) - 2)))
        frame = frame[: cut - 1] + b"\xce"
        frame[3:7] = (len(frame) - 8).to_bytes(4, "big")
    elif kind == 1:  # bad end octet
        frame[-1] = draw(st.integers(0, 0xCD))
    elif kind == 2:  # length field lies
        frame[3:7] = draw(st.integers(0, 1 << 20)).to_bytes(4, "big")
    elif kind == 3:  # another channel, 0 included
        frame[1:3] = draw(st.integers(0, 5)).to_bytes(2, "big")
    elif kind == 4 and len(frame) >= 12:  # unknown class or method
        frame[7:11] = draw(st.integers(0, 0xFFFFFFFF)).to_bytes(4, "big")
    elif kind == 5:  # unknown frame type
        frame[0] = draw(st.sampled_from([0, 4, 5, 9, 0xFF]))
    else:  # random bytes inserted
        at = draw(st.integers(0, len(frame)))
        frame[at:at] = draw(st.binary(min_size=1, max_size=20))
    return bytes(frame)


_STEP = st.one_of(
    st.tuples(st.just("client"), st.sampled_from(_CLIENT_FRAMES)),
    st.tuples(st.just("upstream"), st.sampled_from(_UPSTREAM_FRAMES)),
    st.tuples(st.just("client"), _mutated()),
    st.tuples(st.just("drain"), st.just(b"")),
    st.tuples(st.just("tick"), st.just(b"")),
)


def _well_formed(data: bytes) -> None:
    """Every byte is part of a complete, well-formed frame."""
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 8, "partial frame"
        kind, _channel, size = _FRAME.unpack_from(data, pos)
        assert kind in (1, 2, 3, 8), f"frame type {kind}"
        end = pos + size + 8
        assert end <= len(data), "frame runs past the output"
        assert data[end - 1] == 0xCE, "frame end"
        pos = end


def _check_bounds(w: Wire, last_chunk: int) -> None:
    engine = w.engine
    pending = len(engine.from_client.inbound.pending)
    limit = engine.from_client.inbound.max_frame + 8 + last_chunk
    assert pending <= max(limit, PRE_LOGIN_BUFFER)
    assert len(engine.from_upstream.inbound.pending) <= engine.from_upstream.inbound.max_frame + 8


def _feed_client(w: Wire, data: bytes, cuts: list[int]) -> None:
    start = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > start:
            w.client(data[start:cut])
            _check_bounds(w, cut - start)
            start = cut


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(_STEP, max_size=25),
    cuts=st.lists(st.integers(0, 10_000), max_size=4),
)
def test_the_engine_survives_any_conversation(
    steps: list[tuple[str, bytes]], cuts: list[int]
) -> None:
    w = wire()
    w.open_channel(2)
    upstream_out = bytearray()
    for kind, data in steps:
        if kind == "client":
            _feed_client(w, data, cuts)
        elif kind == "upstream":
            upstream_out += data
            w.upstream(data)
        elif kind == "drain":
            w.gateway.removed("/", "q", 1000, 1000)
            w.refresh()
        else:
            w.tick(w.now + 6.0)
        _check_bounds(w, len(data))
    _well_formed(bytes(w.to_client))


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(st.sampled_from(_CLIENT_FRAMES), max_size=20), data=st.data())
def test_how_a_valid_stream_is_cut_into_reads_changes_nothing(
    frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(frames)
    whole, cut = wire(stop_count=1000), wire(stop_count=1000)
    for w in (whole, cut):
        w.open_channel(2)
    whole.client(stream) if stream else None
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    _feed_client(cut, stream, cuts)
    assert bytes(cut.to_upstream) == bytes(whole.to_upstream)
    assert bytes(cut.to_client) == bytes(whole.to_client)


def _at_phase(case: RecordedCase) -> tuple[Wire, Actions]:
    w = wire(login=case.phase == "open")
    if case.phase == "header":
        return w, w.client(case.data)
    w.client(PROTOCOL_HEADER)
    w.upstream(method(0, commands.Connection.Start()))
    if case.phase == "tune":
        w.client(START_OK)
        w.upstream(method(0, commands.Connection.Tune(frame_max=131072)))
    w.to_client.clear()
    w.to_upstream.clear()
    return w, w.client(case.data)


@pytest.mark.parametrize("case", [c for c in CASES if c.phase == "open"], ids=lambda c: c.name)
def test_after_login_rabbitmq_gets_the_bytes_to_answer(case: RecordedCase) -> None:
    w, _actions = _at_phase(case)
    assert bytes(w.to_upstream) == case.data
    assert not [m for ch, m in w.client_methods() if ch == 0]


@pytest.mark.parametrize("case", [c for c in CASES if c.phase != "open"], ids=lambda c: c.name)
def test_before_login_the_gateway_answers_instead_of_dropping_the_socket(
    case: RecordedCase,
) -> None:
    w, actions = _at_phase(case)
    if case.answer.kind == "protocol-header":
        assert bytes(w.to_client) == PROTOCOL_HEADER
        assert actions.close
        return
    if case.answer.kind == "eof":
        closes = w.client_methods()
        assert [type(m).__name__ for _, m in closes] == ["Close"]
        assert closes[0][1].reply_code in (501, 504, 505)
        assert actions.close
        return
    # RabbitMQ answers before login too: the engine lets it.
    assert FrameReader().feed(bytes(w.to_upstream))[1]
