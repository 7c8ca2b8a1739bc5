"""The same tables on ``local[2]``, on a standalone Spark cluster and through Spark Connect.

Each test starts its own servers from the installed PySpark (free ports,
small memory, logs and work directories under ``tmp_path``) and stops
them, so the tests run in parallel with everything else (pytest-xdist).
The job runs as ``rabbitflow-analyze`` in a process of its own, as an
operator would run it, once as a batch and once ``--incremental``; both
must give the tables the local batch job gives.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from rabbitflow_pipeline.cli import TABLES, analyze
from rabbitflow_pipeline.generate import generate

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
ANALYZE = Path(sys.executable).parent / "rabbitflow-analyze"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spark_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(tmp / "logs"),
            "SPARK_LOCAL_DIRS": str(tmp / "local"),
            "SPARK_WORKER_DIR": str(tmp / "work"),
            "SPARK_DAEMON_MEMORY": "512m",
            "PYSPARK_PYTHON": sys.executable,
            "TZ": "UTC",
        }
    )
    return env


class Server:
    """A Spark server process in a session of its own; its output goes to a log file."""

    def __init__(self, name: str, args: list[str], tmp: Path) -> None:
        self.log = tmp / f"{name}.log"
        self._out = self.log.open("wb")
        self.process = subprocess.Popen(
            [str(SPARK_CLASS), *args],
            env=spark_env(tmp),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"{what}: exited {self.process.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not ready in {timeout:.0f}s: {self.tail()}")
            time.sleep(0.5)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=60)
        self._out.close()


def master_json(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as response:
        loaded: dict[str, object] = json.load(response)
        return loaded


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def alive_workers(port: int) -> int:
    try:
        return int(str(master_json(port).get("aliveworkers", 0)))
    except OSError:
        return 0


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (2 cores, 1 GiB for executors)."""
    tmp = tmp_path / "standalone"
    tmp.mkdir()
    port, ui = free_port(), free_port()
    master = Server(
        "master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        tmp,
    )
    servers = [master]
    try:
        master.wait_until(lambda: accepts(ui), "standalone master")
        worker = Server(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                "2",
                "--memory",
                "1g",
                "--work-dir",
                str(tmp / "work"),
            ],
            tmp,
        )
        servers.append(worker)
        worker.wait_until(lambda: alive_workers(ui) >= 1, "standalone worker")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for server in reversed(servers):
            server.stop()


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[str]:
    """A Spark Connect server (its own local[2] Spark, 1 GiB driver)."""
    tmp = tmp_path / "connect"
    tmp.mkdir()
    port = free_port()
    server = Server(
        "connect",
        [
            "org.apache.spark.deploy.SparkSubmit",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "spark-internal",
        ],
        tmp,
    )
    try:
        server.wait_until(lambda: accepts(port), "Spark Connect server")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def logs(tmp_path: Path) -> list[str]:
    src = tmp_path / "logs"
    generate(src, events=3000, queues=10, days=0.2, gateways=2, processes=1)
    return [str(src / "gateway-*.jsonl")]


def run_analyze(args: list[str], tmp: Path) -> None:
    done = subprocess.run(
        [str(ANALYZE), *args],
        env=spark_env(tmp),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_tables(spark: SparkSession, actual: Path, expected: Path) -> None:
    for table in TABLES:
        assertDataFrameEqual(
            spark.read.parquet(str(actual / table)), spark.read.parquet(str(expected / table))
        )


def check_cluster(spark: SparkSession, tmp_path: Path, logs: list[str], where: list[str]) -> None:
    local = tmp_path / "local"
    analyze(spark, logs, local)
    batch, incremental = tmp_path / "batch", tmp_path / "incremental"
    run_analyze([*logs, "--out", str(batch), *where], tmp_path)
    assert_same_tables(spark, batch, local)
    run_analyze([*logs, "--out", str(incremental), "--incremental", *where], tmp_path)
    assert_same_tables(spark, incremental, local)


def test_standalone_cluster_gives_the_local_tables(
    spark: SparkSession, tmp_path: Path, standalone: str, logs: list[str]
) -> None:
    check_cluster(spark, tmp_path, logs, ["--master", standalone])


def test_spark_connect_gives_the_local_tables(
    spark: SparkSession, tmp_path: Path, connect_server: str, logs: list[str]
) -> None:
    check_cluster(spark, tmp_path, logs, ["--remote", connect_server])
