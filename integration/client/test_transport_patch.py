"""The pika internals the SDK relies on are in place on real connections to
RabbitMQ, for the sync and the asyncio transport (with the installed pika)."""

from __future__ import annotations

from typing import Any

import pytest

from rabbitflow._transport import PikaTransport
from rabbitflow.aio._transport import AioTransport

from ..conftest import Broker


class _Listener:
    def on_blocked(self, reason: str) -> None:
        pass

    def on_unblocked(self) -> None:
        pass

    def on_lost(self, error: Any) -> None:
        pass


def test_the_sync_transport_patches_pika_and_writes_its_own_frames(broker: Broker) -> None:
    transport = PikaTransport(broker.url, _Listener())
    transport.connect()
    try:
        assert transport.writes_coalesced
        assert transport.raw_output() is not None
    finally:
        transport.close()


@pytest.mark.asyncio
async def test_the_aio_transport_writes_its_own_frames(broker: Broker) -> None:
    transport = AioTransport(broker.url, _Listener())
    await transport.connect()
    try:
        assert transport.raw_output() is not None
    finally:
        await transport.close()
