"""``--workers 2``: two gateway processes on one port, one cluster, one supervisor.

The command runs as operators run it, in front of the shared RabbitMQ: both
workers accept connections on the one port, the cluster lists both, a
flow-controlled queue's bound holds with producers spread over the workers,
and a worker killed with ``kill -9`` is restarted by the supervisor and
rejoins the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from integration.broker._depth import DepthWatcher
from integration.broker._producers import WindowProducer
from integration.broker.conftest import wait_for
from integration.cluster._members import cluster_name, forget_cluster
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port, wait_for_amqp

WORKERS = 2
STOP, RESUME = 300, 150
BATCH = 20
CAPACITY = 10
#: Producers started one by one until each worker serves this many.
PRODUCERS_PER_WORKER = 2
MAX_PRODUCERS = 16


def _admin_ports(n: int) -> int:
    """A port P such that P..P+n-1 are free right now."""
    for _ in range(50):
        base = free_port()
        if base + n - 1 > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no {n} consecutive free ports")


class Workers:
    """``rabbitflow-broker --workers N`` as a subprocess."""

    def __init__(self, broker: Broker, workdir: Path, n: int) -> None:
        self.n = n
        self.port = free_port()
        self.admin_base = _admin_ports(n)
        self.cluster = cluster_name()
        self.log_path = workdir / "supervisor.log"
        self.args = [
            sys.executable,
            "-m",
            "rabbitflow_broker.cli",
            "--workers",
            str(n),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_base}",
            "--upstream",
            broker.url,
            "--management-url",
            broker.management_url or "http://127.0.0.1:15672",
            "--event-log",
            str(workdir / "events.jsonl"),
            "--cluster",
            self.cluster,
            "--cluster-batch",
            str(BATCH),
            "--cluster-lease",
            "1000",
            "--log-format",
            "json",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Workers:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log)
        wait_for_amqp("127.0.0.1", self.port, 30)
        for index in range(self.n):
            wait_for(
                lambda index=index: self.http(index, "/api/ready")[0] == 200,
                timeout=30,
                interval=0.05,
                what=f"worker {index} ready",
            )
        return self

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def http(self, index: int, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.admin_base + index}{path}", timeout=5
            ) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (urllib.error.URLError, OSError) as exc:
            return 0, repr(exc)

    def get(self, index: int, path: str) -> Any:
        status, body = self.http(index, path)
        assert status == 200, (index, path, status, body)
        return body

    def connections(self) -> list[int]:
        """Client connections each worker serves now."""
        return [int(self.get(i, "/api/runtime")["connections"]) for i in range(self.n)]

    def own_pid(self, index: int) -> int | None:
        """Worker ``index``'s pid, once its cluster view lists itself."""
        view = self.get(index, "/api/cluster")
        return next((int(m["pid"]) for m in view["members"] if m["id"] == view["member"]), None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@pytest.fixture
def workers(broker: Broker, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(broker, tmp_path, WORKERS).start()
    yield running
    running.stop()
    forget_cluster(broker, running.cluster)
    # Shown by pytest only for a failing test.
    print(f"--- supervisor and workers log ---\n{running.log()[-8000:]}")


def _both_members(workers: Workers) -> bool:
    views = [workers.get(i, "/api/cluster") for i in range(workers.n)]
    return (
        all(
            len({m["pid"] for m in v["members"]}) == workers.n and v["owner"] is not None
            for v in views
        )
        and len({v["owner"] for v in views}) == 1
    )


class _Drain(threading.Thread):
    """Consumes straight from RabbitMQ until halted, acking each message."""

    def __init__(self, broker: Broker, queue: str) -> None:
        super().__init__(daemon=True)
        self.broker, self.queue = broker, queue
        self.halt = threading.Event()
        self.count = 0

    def run(self) -> None:
        connection = self.broker.blocking_connection()
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        for method, _props, _body in channel.consume(self.queue, inactivity_timeout=0.05):
            if method is not None:
                self.count += 1
                channel.basic_ack(method.delivery_tag)
                time.sleep(0.003)
            if self.halt.is_set():
                break
        channel.cancel()
        connection.close()


@pytest.mark.slow
def test_two_workers_share_the_port_the_cluster_and_the_bound_and_a_killed_one_returns(
    broker: Broker,
    workers: Workers,
    unique_name: Any,
    cleanup_queues: list[str],
) -> None:
    # One cluster of two members, each a process of its own.
    wait_for(lambda: _both_members(workers), timeout=30, interval=0.1, what="2 members, 1 owner")
    pids = [
        int(wait_for(lambda i=i: workers.own_pid(i), what=f"worker {i}'s pid"))
        for i in range(workers.n)
    ]
    assert len(set(pids)) == workers.n
    assert os.getpid() not in pids
    assert workers.process is not None
    assert workers.process.pid not in pids

    queue = unique_name("workers")
    cleanup_queues.append(queue)
    declare = pika.BlockingConnection(pika.URLParameters(workers.url))
    declare.channel().queue_declare(
        queue, arguments={"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": RESUME}
    )
    declare.close()
    wait_for(lambda: workers.connections() == [0] * workers.n, what="the declaring client gone")

    # Producers on the one port, started one by one until each worker serves some:
    # the kernel spreads connections over the processes listening with SO_REUSEPORT.
    watcher = DepthWatcher(broker, queue)
    watcher.start()
    producers: list[WindowProducer] = []
    drain = _Drain(broker, queue)
    try:
        while min(workers.connections()) < PRODUCERS_PER_WORKER:
            assert len(producers) < MAX_PRODUCERS, (
                f"{len(producers)} connections all served by the same worker: "
                f"{workers.connections()}"
            )
            producer = WindowProducer(
                workers.url, queue, pid=str(len(producers)), count=None, capacity=CAPACITY
            )
            producer.start()
            producers.append(producer)
            wait_for(
                lambda: sum(workers.connections()) == len(producers),
                timeout=10,
                what=f"producer {producer.pid} connected",
            )
        # Both workers stop the queue's producers at the cluster-wide stop threshold.
        wait_for(
            lambda: all(
                workers.get(i, f"/api/queues/%2F/{queue}")["flowStopped"] is True
                for i in range(workers.n)
            ),
            timeout=30,
            what="flowStopped on both workers",
        )
        # What the workers completed is in RabbitMQ before the drain starts:
        # the owner counts a publish when a worker reports it, RabbitMQ a
        # moment later. So wait until RabbitMQ's depth stands still.
        wait_for(watcher.steady, timeout=30, what="RabbitMQ's depth settled")
        for producer in producers:
            assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"
        marks = {p.pid: p.confirmed for p in producers}
        drain.start()
        wait_for(
            lambda: all(p.confirmed > marks[p.pid] + CAPACITY for p in producers),
            timeout=30,
            what="every producer confirmed again after the release",
        )
    finally:
        for producer in producers:
            producer.stop()
        for producer in producers:
            assert producer.done.wait(20), f"producer {producer.pid} did not stop"
        drain.halt.set()
        if drain.is_alive():
            drain.join(10)
    for producer in producers:
        assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"
    peak = watcher.finish()
    bound = STOP + len(producers) * CAPACITY + workers.n * BATCH
    # The owner may flow a little early, never late: a grant that expires
    # unreported counts as used, and a report that comes in after RabbitMQ's
    # count was adopted counts its messages again (each at most a batch per
    # member near the threshold), until RabbitMQ's count corrects it.
    early = STOP - 2 * workers.n * BATCH
    print(f"peak depth {peak}, stop {STOP}, bound {bound}")  # shown with -s
    assert early < peak <= bound, f"peak depth {peak}: stop {STOP}, bound {bound}"

    # kill -9 of a worker: the supervisor starts another on the same port and
    # admin port, and it rejoins the cluster.
    victim = pids[1]
    os.kill(victim, signal.SIGKILL)

    def replaced() -> int | None:
        status, _ = workers.http(1, "/api/ready")
        if status != 200:
            return None
        pid = workers.own_pid(1)
        return pid if pid != victim else None

    new_pid = wait_for(replaced, timeout=30, interval=0.1, what="worker 1 restarted")
    wait_for(
        lambda: {m["pid"] for m in workers.get(0, "/api/cluster")["members"]} == {pids[0], new_pid},
        timeout=30,
        interval=0.1,
        what="the restarted worker in worker 0's cluster view, the dead one gone",
    )
    died = [r for r in workers.log_records() if r.get("event") == "worker died; restarting it"]
    assert [(r["worker"], r["pid"], r["how"]) for r in died] == [(1, victim, "killed by SIGKILL")]
    # The port still serves.
    probe = pika.BlockingConnection(pika.URLParameters(workers.url))
    probe.close()

    # SIGTERM to the supervisor stops both workers, and it exits 0.
    assert workers.stop() == 0
    for pid in (pids[0], new_pid):
        wait_for(lambda pid=pid: not _alive(pid), timeout=10, what=f"worker {pid} gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
