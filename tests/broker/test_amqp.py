"""The engine's fixed-field readers and content-header reading (rabbitflow_broker.engine.amqp)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from rabbitflow_broker.engine.amqp import content_properties, u16, u32, u64


@given(st.binary(min_size=8, max_size=40), st.data())
def test_readers_agree_with_struct_at_every_position(data: bytes, draw: st.DataObject) -> None:
    pos = draw.draw(st.integers(0, len(data) - 8))
    assert u16(data, pos) == struct.unpack_from(">H", data, pos)[0]
    assert u32(data, pos) == struct.unpack_from(">I", data, pos)[0]
    assert u64(data, pos) == struct.unpack_from(">Q", data, pos)[0]


@pytest.mark.parametrize(("reader", "width"), [(u16, 2), (u32, 4), (u64, 8)])
def test_a_reader_past_the_end_raises_index_error(reader: object, width: int) -> None:
    data = b"\xff" * (width - 1)
    with pytest.raises(IndexError):
        reader(data, 0)  # type: ignore[operator]


@pytest.mark.parametrize("size", [0, 1, 255, 65_536, 2**32 + 7, 2**63 + 5])
def test_content_properties_reads_every_body_size(size: int) -> None:
    raw = pamqp_frame.marshal(
        pamqp_header.ContentHeader(0, size, commands.Basic.Properties(delivery_mode=2)), 1
    )
    info = content_properties(raw, 7, len(raw) - 1)
    assert (info.body_size, info.persistent, info.headers) == (size, True, None)
