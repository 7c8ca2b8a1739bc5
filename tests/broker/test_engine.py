"""The connection engine as plain calls on byte strings: no sockets, no event loop."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from rabbitflow_broker.engine import connection as engine_module
from rabbitflow_broker.engine.amqp import PROTOCOL_HEADER
from rabbitflow_broker.engine.connection import PAUSE_MESSAGES, PRE_LOGIN_BUFFER
from rabbitflow_broker.engine.state import Mode
from tests.broker.engine_harness import deliver, method, publish, wire


def test_importing_the_engine_imports_neither_asyncio_nor_socket() -> None:
    code = (
        "import sys, rabbitflow_broker.engine.connection;"
        "print(sorted({'asyncio', 'socket'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_whole_read_of_publishes_goes_upstream_as_the_same_bytes() -> None:
    w = wire(stop_count=100)
    raw = publish(1, "q") + publish(1, "q", b"y" * 300)
    actions = w.client(raw)
    assert actions.to_upstream == [raw]


def test_publishes_split_across_reads_are_forwarded_unchanged() -> None:
    w = wire(stop_count=100)
    raw = publish(1, "q", b"a" * 1000) * 3
    for start in range(0, len(raw), 7):
        w.client(raw[start : start + 7])
    assert bytes(w.to_upstream) == raw
    assert w.gateway.depth.get(("/", "q")).messages == 3


@given(st.lists(st.integers(1, 1047), min_size=1, max_size=3, unique=True))
def test_a_publish_cut_anywhere_goes_upstream_whole_once_it_is_complete(cuts: list[int]) -> None:
    w = wire(stop_count=100)
    raw = publish(1, "q", b"a" * 1000)
    assert len(raw) == 1048
    w.to_upstream.clear()
    bounds = [0, *sorted(cuts), len(raw)]
    for start, stop in itertools.pairwise(bounds[:-1]):
        w.client(raw[start:stop])
        assert bytes(w.to_upstream) == b""  # nothing of it goes before all of it is here
        assert w.gateway.depth.get(("/", "q")).messages == 0
    w.client(raw[bounds[-2] :] + raw[:5])
    assert bytes(w.to_upstream) == raw
    assert w.gateway.depth.get(("/", "q")).messages == 1


@given(st.integers(0, 40))
def test_a_publish_with_an_empty_body_goes_upstream_at_once(cut: int) -> None:
    w = wire(stop_count=100)
    empty = publish(1, "q", b"")[:-8]  # method and header; no body frame follows
    w.to_upstream.clear()
    w.client(empty[:cut] if cut else empty)
    if cut:
        w.client(empty[cut:])
    assert bytes(w.to_upstream) == empty
    assert w.gateway.depth.get(("/", "q")).messages == 1


def test_bytes_waiting_for_their_message_go_first_once_rabbitmq_closes() -> None:
    w = wire(stop_count=100)
    raw = publish(1, "q", b"a" * 1000)
    w.to_upstream.clear()
    w.client(raw[:-100])  # waits whole
    w.upstream(
        method(
            0, commands.Connection.Close(reply_code=320, reply_text="x", class_id=0, method_id=0)
        )
    )
    close_ok = method(0, commands.Connection.CloseOk())
    w.client(raw[-100:] + close_ok)
    assert bytes(w.to_upstream) == raw + close_ok


def test_client_flow_ok_is_not_forwarded() -> None:
    w = wire()
    w.client(method(1, commands.Channel.FlowOk(active=False)))
    assert w.upstream_methods() == []


def test_publish_over_stop_flows_the_channel_once() -> None:
    w = wire()
    w.client(publish(1, "q"), publish(1, "q"), publish(1, "q"))
    flows = [m.active for _, m in w.client_methods() if isinstance(m, commands.Channel.Flow)]
    assert flows == [False]
    assert w.codes() == ["CHN-1005"]


def test_held_confirms_are_split_from_a_multiple_ack_and_released_as_one() -> None:
    w = wire(stop_count=1)
    w.gateway.routing.declare_queue("/", "free", {})
    w.client(method(1, commands.Confirm.Select()))
    w.upstream(method(1, commands.Confirm.SelectOk()))
    w.client(publish(1, "free"), publish(1, "free"), publish(1, "q"), publish(1, "q"))
    w.client_methods()
    w.upstream(method(1, commands.Basic.Ack(delivery_tag=1)))
    assert [m.delivery_tag for _, m in w.client_methods()] == [1]
    w.upstream(method(1, commands.Basic.Ack(delivery_tag=4, multiple=True)))
    acks = [m for _, m in w.client_methods() if isinstance(m, commands.Basic.Ack)]
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(2, False)]
    w.gateway.removed("/", "q", 2, 2)
    w.refresh()
    sent = [m for _, m in w.client_methods()]
    assert [(a.delivery_tag, a.multiple) for a in sent if isinstance(a, commands.Basic.Ack)] == [
        (4, True)
    ]


def test_flow_frames_wait_for_a_delivery_in_progress_on_their_channel() -> None:
    w = wire()
    w.client(method(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True)))
    w.upstream(method(1, commands.Basic.ConsumeOk("c")))
    whole = deliver(1, "c", 1, b"0123456789")
    w.to_client.clear()
    w.upstream(whole[:-5])  # the body is not complete
    w.to_client.clear()
    w.client(publish(1, "q"), publish(1, "q"))  # flows channel 1
    assert w.client_methods() == []
    w.upstream(whole[-5:])
    body_frame = whole[-18:]
    assert bytes(w.to_client).startswith(body_frame)
    flows = [m for _, m in w.client_methods() if isinstance(m, commands.Channel.Flow)]
    assert [f.active for f in flows] == [False]


def test_channels_are_flowed_and_unflowed_each_in_order() -> None:
    w = wire()
    w.open_channel(2)
    w.client(publish(1, "q"), publish(1, "q"), publish(2, "q"))
    w.gateway.removed("/", "q", 3, 3)
    w.refresh()
    flows = [(ch, m.active) for ch, m in w.client_methods() if isinstance(m, commands.Channel.Flow)]
    assert flows == [(1, False), (2, False), (1, True), (2, True)]
    assert w.codes() == ["CHN-1005", "CHN-1005", "CHN-1006", "CHN-1006"]


def test_commit_ok_is_held_while_the_queue_is_full_and_kept_in_order() -> None:
    w = wire()
    w.client(method(1, commands.Tx.Select()))
    w.upstream(method(1, commands.Tx.SelectOk()))
    w.client(publish(1, "q"), publish(1, "q"), method(1, commands.Tx.Commit()))
    w.client(method(1, commands.Tx.Commit()))
    w.client_methods()
    w.upstream(method(1, commands.Tx.CommitOk()), method(1, commands.Tx.CommitOk()))
    assert not [m for _, m in w.client_methods() if isinstance(m, commands.Tx.CommitOk)]
    assert w.engine.held_confirms() == 2
    w.gateway.removed("/", "q", 2, 2)
    w.refresh()
    kinds = [type(m).__name__ for _, m in w.client_methods()]
    assert kinds == ["CommitOk", "CommitOk", "Flow"]


def test_publishing_past_the_enforcement_timeout_closes_only_the_channel() -> None:
    w = wire(enforcement=1.0)
    w.client(publish(1, "q"), publish(1, "q"))
    w.client_methods()
    w.now += 2.0
    w.client(publish(1, "q"))
    closes = [(ch, m) for ch, m in w.client_methods() if isinstance(m, commands.Channel.Close)]
    assert [(ch, m.reply_code) for ch, m in closes] == [(1, 406)]
    upstream = [(ch, m.reply_code) for ch, m in w.upstream_methods() if hasattr(m, "reply_code")]
    assert upstream == [(1, 200)]
    assert w.codes() == ["CHN-1005", "CHN-1012"]


def test_a_flowed_channel_that_closes_logs_chn_1003() -> None:
    w = wire()
    w.client(publish(1, "q"), publish(1, "q"))
    w.client(method(1, commands.Channel.Close(200, "bye", 0, 0)))
    w.upstream(method(1, commands.Channel.CloseOk()))
    assert w.codes() == ["CHN-1005", "CHN-1003"]


def test_a_connection_that_ends_after_login_logs_con_1002() -> None:
    w = wire()
    w._take(w.engine.client_gone(w.now))
    assert w.codes() == ["CON-1002"]


def test_back_pressure_allowance_is_summed_over_the_connections_channels() -> None:
    w = wire()
    for number in range(2, 6):
        w.open_channel(number)
    w.client(publish(1, "q"))
    actions = w.client(*(publish(1 + n % 5, "q") for n in range(PAUSE_MESSAGES + 10)))
    assert not actions.read_client
    assert actions.timer is not None


def test_back_pressure_allowance_is_kept_across_channel_close_and_reopen() -> None:
    w = wire(enforcement=None)
    w.client(publish(1, "q"), publish(1, "q"))  # flowed
    w.client(b"".join(publish(1, "q") for _ in range(PAUSE_MESSAGES - 10)))
    w.client(method(1, commands.Channel.Close(200, "", 0, 0)))
    w.upstream(method(1, commands.Channel.CloseOk()))
    w.open_channel(1)
    actions = w.client(b"".join(publish(1, "q") for _ in range(30)))
    assert not actions.read_client


def test_reads_resume_when_the_queue_drains() -> None:
    w = wire(enforcement=None)
    w.client(publish(1, "q"))
    actions = w.client(b"".join(publish(1, "q") for _ in range(PAUSE_MESSAGES + 5)))
    assert not actions.read_client
    w.gateway.queue_deleted("/", "q")
    assert w.refresh().read_client


def test_a_repeat_offender_connection_is_closed_with_406() -> None:
    w = wire(enforcement=1.0)
    w.client(publish(1, "q"), publish(1, "q"))
    w.now += 2.0
    w.client(publish(1, "q"))  # CHN-1012, channel 1 closed
    w.client(method(1, commands.Channel.CloseOk()))
    w.upstream(method(1, commands.Channel.CloseOk()))
    w.open_channel(1)
    w.client(publish(1, "q"))  # flowed again
    w.now += 2.0
    w.to_client.clear()
    w.client(publish(1, "q"))
    ((_, close),) = [(c, m) for c, m in w.client_methods() if c == 0]
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 406


def test_acked_deliveries_leave_the_queue_depth() -> None:
    w = wire(stop_count=100)
    w.client(publish(1, "q", b"abc"), publish(1, "q", b"defg"))
    w.client(method(1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    w.upstream(method(1, commands.Basic.ConsumeOk("c")))
    w.upstream(deliver(1, "c", 1, b"abc") + deliver(1, "c", 2, b"defg"))
    w.client(method(1, commands.Basic.Ack(delivery_tag=2, multiple=True)))
    depth = w.gateway.depth.get(("/", "q"))
    assert (depth.messages, depth.bytes) == (0, 0)


def test_a_frame_over_4096_bytes_before_tune_ok_is_closed_with_501() -> None:
    w = wire(login=False)
    w.client(PROTOCOL_HEADER)
    w.upstream(method(0, commands.Connection.Start()))
    w.to_client.clear()
    actions = w.client(b"\x01\x00\x00\x00\x10\x00\x00")  # announces a 1 MiB frame
    ((_, close),) = w.client_methods()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501
    assert actions.close


def test_reads_stop_at_64_kib_while_the_upstream_connection_opens() -> None:
    w = wire(login=False, connected=False)
    heartbeats = b"\x08\x00\x00\x00\x00\x00\x00\xce" * (PRE_LOGIN_BUFFER // 8)
    actions = w.client(PROTOCOL_HEADER + heartbeats)
    assert not actions.read_client


def test_more_than_64_kib_buffered_before_login_is_refused() -> None:
    w = wire(login=False, connected=False)
    actions = w.client(b"\x00" * (PRE_LOGIN_BUFFER + 1))
    assert actions.close or b"\x0a\x00\x32" in bytes(w.to_client)


def test_the_handshake_timeout_closes_a_connection_that_never_logs_in() -> None:
    w = wire(login=False, handshake=10.0)
    w.client(PROTOCOL_HEADER[:4])
    assert w.last is not None
    assert w.last.timer == 110.0
    w.tick(110.0)
    ((_, close),) = w.client_methods()
    assert isinstance(close, commands.Connection.Close)


def test_start_ok_with_a_huge_client_properties_table_is_read_without_decoding_it() -> None:
    entries = b"".join(b"\x01k" + b"t\x01" for _ in range(116_000))
    table = len(entries).to_bytes(4, "big") + entries
    args = table + b"\x05PLAIN" + (10).to_bytes(4, "big") + b"\x00bob\x00pass!" + b"\x05en_US"
    payload = (10 << 16 | 11).to_bytes(4, "big") + args
    frame = b"\x01\x00\x00" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    w = wire(login=False)
    w.engine.from_client.inbound.max_frame = (
        1 << 24
    )  # what the 4096 bound would refuse, read anyway
    w.client(PROTOCOL_HEADER + frame)
    assert w.engine.user == "bob"


def test_a_channel_method_on_channel_0_before_open_is_closed_with_504() -> None:
    w = wire(login=False)
    w.client(PROTOCOL_HEADER)
    w.client(method(0, commands.Basic.Qos()))
    ((_, close),) = w.client_methods()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 504


def test_a_bad_frame_after_open_goes_to_rabbitmq_unchanged() -> None:
    w = wire()
    bad = b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0b\x00"
    rest = publish(1, "q")
    w.client(bad + rest)
    assert bytes(w.to_upstream) == bad + rest
    assert w.to_client == bytearray()


def test_upstream_refusal_reaches_the_client_as_320_with_the_cause() -> None:
    w = wire(login=False)
    w._take(w.engine.upstream_failed(w.now, "upstream unreachable: connection refused"))
    ((_, close),) = w.client_methods()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 320
    assert "upstream unreachable: connection refused" in close.reply_text


def test_the_engine_module_defines_its_limits() -> None:
    assert engine_module.PRE_LOGIN_FRAME_MAX == 4096
    assert engine_module.PRE_LOGIN_BUFFER == 64 * 1024


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9000), min_size=1, max_size=25),
    cuts=st.lists(st.integers(0, 250_000), max_size=12),
)
def test_any_split_of_a_publish_stream_is_forwarded_whole_and_counted_once(
    sizes: list[int], cuts: list[int]
) -> None:
    """However the socket cuts a stream of publishes (a frame completed by the
    head of the next read, several frames per read, one byte at a time), the
    same bytes go upstream in order and every publish is counted once."""
    w = wire(stop_count=0)
    stream = b"".join(publish(1, "q", bytes([n % 251]) * n) for n in sizes)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    w.client(*(stream[a:b] for a, b in itertools.pairwise(points)))
    assert bytes(w.to_upstream) == stream
    depth = w.gateway.depth.get(("/", "q"))
    assert (depth.messages, depth.bytes) == (len(sizes), sum(sizes))


def test_a_frame_completed_by_the_next_read_stops_a_flowed_stream_as_one_read_would() -> None:
    """The parse of a flowed connection stops after the publish that spends its
    allowance whether the stream came in one read or the head of the second
    read completed that publish's last frame; what is not parsed stays for
    later, unsent."""
    stream = b"".join(publish(1, "q", b"y" * 100) for _ in range(PAUSE_MESSAGES + 50))
    whole = wire(stop_count=1)
    whole.client(stream)
    stop = len(whole.to_upstream)
    assert 0 < stop < len(stream)
    for back in (1, 5, 50):  # the second read completes the body of the last publish parsed
        split = wire(stop_count=1)
        split.client(stream[: stop - back], stream[stop - back :])
        assert bytes(split.to_upstream) == bytes(whole.to_upstream)
        assert split.engine.from_client.inbound.pending == whole.engine.from_client.inbound.pending


def _rabbitmq_close(code: int, text: str) -> bytes:
    return method(
        0, commands.Connection.Close(reply_code=code, reply_text=text, class_id=0, method_id=0)
    )


SHUTDOWN = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"


def test_a_node_stopping_reaches_the_client_as_320_naming_the_node() -> None:
    w = wire(node="10.0.0.2:5672")
    w.upstream(deliver(1, "c", 1), _rabbitmq_close(320, SHUTDOWN))
    got = w.client_methods()
    assert isinstance(got[0][1], commands.Basic.Deliver)  # what came before goes first
    ((channel, close),) = got[1:]
    assert channel == 0
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 320
    assert close.reply_text == f"upstream node 10.0.0.2:5672 went away: {SHUTDOWN}"
    assert (close.class_id, close.method_id) == (0, 0)
    # The close handshake is RabbitMQ's: the client's Close-Ok goes to it.
    close_ok = method(0, commands.Connection.CloseOk())
    w.client(close_ok)
    assert bytes(w.to_upstream) == close_ok


def test_a_node_that_closed_cleanly_then_dropped_tcp_gets_no_second_close() -> None:
    w = wire(node="10.0.0.2:5672")
    w.upstream(_rabbitmq_close(320, SHUTDOWN))
    assert len(w.client_methods()) == 1  # RabbitMQ's Close, naming the node
    w.upstream_failed("upstream node 10.0.0.2:5672 went away")
    assert w.client_methods() == []  # not a second Close: its Close-Ok is awaited
    w.client(method(0, commands.Connection.CloseOk()))
    assert w.engine.state.mode is Mode.CLOSED


@pytest.mark.parametrize(("code", "text"), [(530, "NOT_ALLOWED - vhost gone"), (403, "ACCESS")])
def test_other_closes_from_rabbitmq_reach_the_client_unchanged(code: int, text: str) -> None:
    w = wire(node="10.0.0.2:5672")
    close = _rabbitmq_close(code, text)
    w.upstream(close)
    assert bytes(w.to_client) == close


def test_a_320_is_unchanged_when_the_node_is_unknown() -> None:
    w = wire()
    close = _rabbitmq_close(320, SHUTDOWN)
    w.upstream(close)
    assert bytes(w.to_client) == close


def test_a_long_320_text_is_cut_to_255_bytes() -> None:
    w = wire(node="rabbit-node-with-a-long-name.example.com:5672")
    w.upstream(_rabbitmq_close(320, "CONNECTION_FORCED - " + "é" * 110))
    ((_, close),) = w.client_methods()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_text.startswith("upstream node rabbit-node-with-a-long-name")
    assert 250 <= len(close.reply_text.encode()) <= 255
