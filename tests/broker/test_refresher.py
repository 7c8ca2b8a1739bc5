"""The driver side of the gateway's changes: Refresher."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_broker.server.refresher import Refresher
from tests.broker.fakes import IdleConnection

STOP_2 = {"qpid.flow_stop_count": 2, "qpid.flow_resume_count": 1}


class FakeRelay(IdleConnection):
    def __init__(self, number: int, vhost: str, log: list[tuple[int, bool]], gw: Gateway) -> None:
        super().__init__(number)
        self.vhost = vhost
        self._log = log
        self._gateway = gw

    def refresh(self) -> None:
        # Refreshed outside the change: the gateway's state is already final.
        self._log.append((self.number, self._gateway.is_blocked(self.vhost, "q")))


@pytest.mark.asyncio
async def test_changes_refresh_the_vhosts_concerned_once_on_a_later_loop_turn() -> None:
    gateway = Gateway(GatewayConfig(), sink=lambda e: None, clock=lambda: dt.datetime.now(dt.UTC))
    gateway.on_change = Refresher(gateway)
    log: list[tuple[int, bool]] = []
    for number, vhost in ((1, "/"), (2, "b"), (3, "/")):
        gateway.register(FakeRelay(number, vhost, log, gateway))
    gateway.queue_declared("/", "q", STOP_2)
    for _ in range(3):
        gateway.published("/", frozenset({"q"}), 1)
    gateway.removed("/", "q", 3, 3)  # OFF again: vhost "/" must re-check
    gateway.stop_producers(vhost="b")
    assert log == []  # nothing runs inside the changes
    await asyncio.sleep(0)
    assert sorted(log) == [(1, False), (2, True), (3, False)]  # one pass, each relay once
    log.clear()
    await asyncio.sleep(0)
    assert log == []
    gateway.start_producers(vhost="b")
    await asyncio.sleep(0)
    assert log == [(2, False)]
