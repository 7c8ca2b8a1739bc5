"""Stored runtime thresholds follow their queue across gateway restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from integration.broker.conftest import RunningGateway, wait_for
from integration.conftest import Broker
from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.server.persistence import FileThresholdStore

STORED = Thresholds(stop_count=10, resume_count=5)


def _stored(path: Path) -> dict[tuple[str, str], Thresholds]:
    return asyncio.run(FileThresholdStore(path).load())


def test_thresholds_of_a_queue_deleted_while_no_gateway_ran_are_forgotten_at_start(
    broker: Broker,
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    kept, gone = unique_name("kept"), unique_name("gone")
    cleanup_queues.extend([kept, gone])
    connection = broker.blocking_connection()
    try:
        connection.channel().queue_declare(kept)
    finally:
        connection.close()
    state = tmp_path / "thresholds.json"
    store = FileThresholdStore(state)
    asyncio.run(store.save(("/", kept), STORED))
    asyncio.run(store.save(("/", gone), STORED))

    gateway = gateway_factory(state_file=str(state))

    wait_for(lambda: ("/", gone) not in _stored(state), what="the deleted queue's thresholds gone")
    assert _stored(state) == {("/", kept): STORED}
    queue = gateway.queue(kept)
    assert (queue["flowStopCount"], queue["flowResumeCount"]) == (10, 5)
