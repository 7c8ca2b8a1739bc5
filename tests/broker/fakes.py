"""In-memory fakes shared by the relay unit tests."""

from __future__ import annotations

from typing import Any

from pamqp.base import Frame

from rabbitflow_broker.frames import PROTOCOL_HEADER, FrameReader, decode_method


class FakeWriter:
    """Collects what the relay writes to one side."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 50514) if name == "peername" else None

    def methods(self) -> list[tuple[int, Frame]]:
        """Method frames written so far, as (channel, method)."""
        buffer, frames = FrameReader(expect_protocol_header=False).feed(
            bytes(self.data).removeprefix(PROTOCOL_HEADER)
        )
        return [(f.channel, decode_method(f.payload(buffer))) for f in frames if f.kind == 1]

    def take(self) -> list[tuple[int, Frame]]:
        got = self.methods()
        self.data.clear()
        return got

    def take_methods(self) -> list[Frame]:
        """Like :meth:`take`, without the channel numbers."""
        return [value for _, value in self.take()]
