"""Connection churn leaves the gateway's memory, descriptors and tasks flat.

A gateway process (the ``rabbitflow-broker`` command, with its collector
settings) relays thousands of short connections (the clients of
``bench/connection_churn.py``, 8 at a time): each logs in, opens a channel
with confirms and publishes one message.  Two in three wait for the
confirm and close cleanly; one in three drops the socket with a reset
right after the publish, before its confirm, half of them with a second
channel open.  After a warm-up the gateway's resident memory may grow by at
most :data:`RSS_GROWTH_ALLOWED`, and its descriptors and asyncio tasks
(``GET /api/runtime``) return to what they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from bench.connection_churn import churn, rss_bytes
from integration.broker.conftest import serving, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
WARM_UP = 500
CHURN = 5_000
RSS_GROWTH_ALLOWED = 2 * 1024 * 1024


def _tcp_ends() -> dict[str, tuple[int, int]]:
    """Socket inode -> (local port, remote port), for this host's TCP sockets."""
    ends: dict[str, tuple[int, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                ends[inode] = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
    return ends


def _descriptors(pid: int, management_port: int) -> tuple[int, list[str]]:
    """How many descriptors the gateway holds, leaving out its connections to
    the management API, and what each of them is.

    The management client keeps a pool of HTTP connections whose size
    follows how many requests overlapped (a depth reconciliation beside a
    routing snapshot): one more pooled connection after the churn is not
    a leak, and it is closed when idle long enough, not when the clients go.
    """
    ends, kept, seen = _tcp_ends(), 0, []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed while listed
        if target.startswith("socket:["):
            local, remote = ends.get(target[8:-1], (0, 0))
            target = f"tcp {local}->{remote}" if local else target
            if remote == management_port:
                seen.append(f"{fd}: {target} (management API, not counted)")
                continue
        kept += 1
        seen.append(f"{fd}: {target}")
    return kept, seen


def _runtime(admin_port: int) -> dict[str, object]:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{admin_port}/api/runtime", timeout=10
    ) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


@pytest.fixture
def churn_queue(broker: Broker, unique_name: Callable[[str], str]) -> Iterator[str]:
    name = unique_name("churn")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        connection.channel().queue_declare(name)
    yield name
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        connection.channel().queue_delete(name)


@pytest.mark.slow
def test_churn_leaves_memory_fds_and_tasks_flat(
    broker: Broker, churn_queue: str, tmp_path: Path
) -> None:
    port, admin_port = free_port(), free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
    log = tmp_path / "gateway.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                BROKER_CLI,
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{admin_port}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url or "http://127.0.0.1:15672",
            ],
            stderr=stderr,
            env=environ,
        )
    try:
        wait_for(lambda: serving(log), timeout=30, what="gateway ready and listening")
        confirmed = asyncio.run(churn(port, churn_queue, 0, WARM_UP))
        wait_for(lambda: _runtime(admin_port)["connections"] == 0, timeout=30, what="warm-up gone")
        pid = process.pid
        before = _runtime(admin_port)
        management_port = urllib.parse.urlsplit(
            broker.management_url or "http://127.0.0.1:15672"
        ).port
        assert management_port is not None
        rss_before = rss_bytes(pid)
        fds_before, held_before = _descriptors(pid, management_port)
        confirmed += asyncio.run(churn(port, churn_queue, WARM_UP, CHURN))
        wait_for(lambda: _runtime(admin_port)["connections"] == 0, timeout=30, what="churn gone")
        # (<=: the baseline may count an admin request's socket not yet closed)
        try:
            wait_for(
                lambda: _descriptors(pid, management_port)[0] <= fds_before,
                timeout=30,
                what=f"descriptors back to {fds_before}",
            )
        except BaseException:
            held_after = _descriptors(pid, management_port)[1]
            print("held before:", *held_before, "held after:", *held_after, sep="\n  ")
            raise
        after = _runtime(admin_port)
        growth = rss_bytes(pid) - rss_before
        # Shown with -s: the figures behind the assertions.
        fds_after = _descriptors(pid, management_port)[0]
        print(f"RSS +{growth / 1024:.0f} KiB, fds {fds_before}->{fds_after}")
        print(f"runtime before {before}\nruntime after {after}")
        assert after["tasks"] == before["tasks"], (before, after)
        assert growth <= RSS_GROWTH_ALLOWED, (
            f"RSS grew by {growth / 1024:.0f} KiB over {CHURN} connections"
        )
        # Every clean client's message was confirmed, and is in the queue.
        assert confirmed == sum(1 for n in range(WARM_UP + CHURN) if n % 3)
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
            depth = connection.channel().queue_declare(churn_queue, passive=True)
        assert depth.method.message_count >= confirmed
    finally:
        process.terminate()
        process.wait(timeout=15)
