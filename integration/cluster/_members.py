"""Cluster members as operators run them: each gateway its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port, wait_for_amqp


class Member:
    """One ``rabbitflow-broker --cluster NAME`` process."""

    def __init__(self, broker: Broker, workdir: Path, cluster: str, index: int, **options: Any):
        self.broker = broker
        self.cluster = cluster
        self.index = index
        self.port = free_port()
        self.admin_port = free_port()
        self.event_log = workdir / f"events-{index}.jsonl"
        self.log_path = workdir / f"gateway-{index}.log"
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Member:
        args = [
            sys.executable,
            "-m",
            "rabbitflow_broker.cli",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
            "--upstream",
            self.broker.url,
            "--management-url",
            self.broker.management_url or "http://127.0.0.1:15672",
            "--event-log",
            str(self.event_log),
            "--cluster",
            self.cluster,
        ]
        for name, value in self.options.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        wait_for_amqp("127.0.0.1", self.port, 30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _ = self.http("GET", "/api/ready")
            if status == 200:
                return self
            time.sleep(0.05)
        raise AssertionError(f"member {self.index} not ready within 30 s:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """kill -9, and reap it."""
        self.signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def http(self, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")
        except (urllib.error.URLError, OSError) as exc:
            return 0, repr(exc)

    def cluster_view(self) -> dict[str, Any]:
        status, body = self.http("GET", "/api/cluster")
        assert status == 200, (status, body)
        return dict(body)

    def events(self, code: str | None = None) -> list[dict[str, Any]]:
        if not self.event_log.exists():
            return []
        records = [
            json.loads(line)
            for line in self.event_log.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        return [r for r in records if code is None or r["code"] == code]


def cluster_name() -> str:
    return f"rf-test-{uuid.uuid4().hex[:8]}"


def forget_cluster(broker: Broker, cluster: str) -> None:
    """Delete a cluster's objects in RabbitMQ once its members are gone (the
    owner and epochs queues are durable: a cluster keeps them across restarts)."""
    import contextlib

    import pika

    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection = pika.BlockingConnection(pika.URLParameters(broker.url.split(",")[0]))
        try:
            channel = connection.channel()
            channel.queue_delete(f"rabbitflow.cluster.{cluster}.owner")
            channel.queue_delete(f"rabbitflow.cluster.{cluster}.epochs")
            channel.exchange_delete(f"rabbitflow.cluster.{cluster}")
        finally:
            connection.close()
