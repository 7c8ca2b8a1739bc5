"""Hundreds of recoveries of one connection leave nothing behind.

A proxy cuts the connection again and again; each time the connection
recovers onto a new transport (its own I/O thread) and restores its
session and producer.  The transports and threads of the lost connections
must go: after 400 recoveries as many are alive as after the first hundred
(at most two of each: a leak of one per recovery shows within a hundred).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from functools import partial

import pytest

import rabbitflow
from rabbitflow._transport import PikaTransport, TransportChannel

from ..conftest import Broker
from ._faults import FaultProxy
from ._support import declare_queue, drain, wait_until

RECONNECTS = 400
#: Recover at once: the time goes into reconnecting, not waiting.
FAST_RECOVERY = {
    "rabbitflow.reconnect_initial_delay": 1,
    "rabbitflow.reconnect_max_delay": 20,
}


def _live(kind: type) -> int:
    """How many objects of ``kind`` are alive once the collector has run
    (pika's connections hold themselves in cycles: the client's collector
    frees them, at its own pace)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def _recovered(connection: rabbitflow.Connection, count: int) -> bool:
    return connection.reconnect_count == count


def _client_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"{name}-")]


@pytest.mark.slow
def test_recoveries_leave_no_growing_set_of_transports_or_threads(
    broker: Broker,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # pika's debug records carry its connection objects: captured, they
    # would keep every transport alive.
    caplog.set_level(logging.WARNING, logger="pika")
    queue = new_queue("churnsdk")
    declare_queue(broker.url, queue)
    samples: list[tuple[int, int, int, int]] = []  # recoveries, transports, channels, threads
    with FaultProxy((broker.host, broker.port)) as proxy:
        factory = rabbitflow.ConnectionFactory(proxy.url(), properties=FAST_RECOVERY)
        connection = factory.create_connection()
        name = connection._name
        session = connection.create_session()
        producer = session.create_producer(session.create_queue(queue))
        sent = 0
        for n in range(1, RECONNECTS + 1):
            proxy.cut_all()
            wait_until(
                partial(_recovered, connection, n),
                timeout=20,
                what=f"recovery {n}",
                interval=0.002,
            )
            if n % 100 == 0:
                producer.send(session.create_text_message(str(n)))
                sent += 1
                threads = len(_client_threads(name))
                samples.append((n, _live(PikaTransport), _live(TransportChannel), threads))
        print(f"(recoveries, transports, channels, threads): {samples}")  # shown with -s
        connection.close()
        wait_until(lambda: not _client_threads(name), timeout=20, what="client threads gone")
        del connection, session, producer
        closed = _live(PikaTransport)
    assert proxy.cuts >= RECONNECTS
    # The current transport and at most one being torn down; one I/O thread
    # and at most one recovery thread still ending.
    assert all(transports <= 2 for _, transports, _, _ in samples), samples
    assert all(channels <= 2 for _, _, channels, _ in samples), samples
    assert all(threads <= 2 for _, _, _, threads in samples), samples
    assert closed == 0
    assert len(drain(broker.url, queue)) >= sent
