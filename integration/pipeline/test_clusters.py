"""The same tables on ``local[2]``, on a standalone Spark cluster and through Spark Connect.

The servers (a standalone master with one worker, and a Spark Connect
server) are started once for the module from the installed PySpark (free
ports, small memory, logs and work directories in a temporary directory)
and shared by its tests, then stopped.  Each job runs in a process of its
own as an operator runs it: the ``rabbitflow-analyze`` entry point with
its usual arguments, as a batch and (through Spark Connect) once more
``--incremental``, in one driver (see ``_cluster_job.py``).  The tables are compared with
pyarrow (``tests/pipeline/tables.py``), so the module needs no Spark session of its own
and runs in parallel with the Spark tests (its own test group).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyspark
import pytest

from rabbitflow_broker.server.rabbitmq_node import free_port
from rabbitflow_pipeline.generate import generate
from tests.pipeline.tables import assert_same_tables

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
ANALYZE = Path(sys.executable).parent / "rabbitflow-analyze"
ROOT = Path(__file__).resolve().parents[2]
#: Seconds a server may take to accept connections on a loaded machine.
READY_S = 240.0
#: JVM options: compile with the JIT's quick tier only (no C2), in a code
#: cache of the default size. With the quick tier only, the JVM's code cache
#: is 48 MiB instead of 240: the Connect server, which compiles every query of
#: a batch run and three steps, once filled it, and the JVM's compiler stopped
#: and the server exited ("Out of space in CodeCache for adapters").
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def spark_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(tmp / "logs"),
            "SPARK_LOCAL_DIRS": str(tmp / "local"),
            "SPARK_WORKER_DIR": str(tmp / "work"),
            # The master, the worker and the Connect server (whose driver runs
            # in the daemon's JVM: Spark needs at least 450 MiB there).
            "SPARK_DAEMON_MEMORY": "512m",
            # The jobs' drivers (local mode: the executor too) and executors.
            "RABBITFLOW_DRIVER_MEMORY": "768m",
            "SPARK_EXECUTOR_MEMORY": "512m",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            "TZ": "UTC",
            # Every JVM here (servers, drivers, executors) lives a minute or
            # two on a small input: without the JIT's optimising tier they
            # spend a third less CPU, and took a fifth less time (measured
            # with this module alone: 239 s -> 158 s of CPU, 125 s -> 98 s).
            "JAVA_TOOL_OPTIONS": f"{env.get('JAVA_TOOL_OPTIONS', '')} {QUICK_JIT}".strip(),
        }
    )
    return env


class Server:
    """A Spark server process in a session of its own; its output goes to a log file."""

    def __init__(self, name: str, args: list[str], tmp: Path) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        self._out = self.log.open("wb")
        self.process = subprocess.Popen(
            [str(SPARK_CLASS), *args],
            env=spark_env(tmp),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"{what}: exited {self.process.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not ready in {READY_S:.0f}s: {self.tail()}")
            time.sleep(0.2)

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
    except (OSError, ValueError):
        # Not answering yet, or answering with its HTML page: the master's web
        # server accepts connections before its JSON page is attached (seen
        # on a loaded machine).
        return 0


def start_standalone(tmp: Path, servers: list[Server]) -> str:
    """A standalone master and one worker (2 cores, 1 GiB for executors of 512 MiB)."""
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
    servers.append(master)
    master.wait_until(lambda: accepts(port) and accepts(ui), "standalone master")
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
    return f"spark://127.0.0.1:{port}"


def start_connect(tmp: Path, servers: list[Server]) -> str:
    """A Spark Connect server (its own local[2] Spark in a 512 MiB JVM)."""
    port = free_port()
    server = Server(
        "connect",
        [
            "org.apache.spark.deploy.SparkSubmit",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "spark-internal",
        ],
        tmp,
    )
    servers.append(server)
    server.wait_until(lambda: accepts(port), "Spark Connect server")
    return f"sc://127.0.0.1:{port}"


def run(args: list[str], tmp: Path) -> None:
    done = subprocess.run(
        args,
        env=spark_env(tmp),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


class Clusters:
    """The module's servers and inputs, and the tables the local batch job gives."""

    def __init__(self, tmp: Path, standalone: str, connect: str, logs: list[str]) -> None:
        self.tmp = tmp
        self.standalone = standalone
        self.connect = connect
        self.logs = logs
        self.local = tmp / "local-run"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    """Start both servers and the local batch run at once; stop the servers at the end."""
    tmp = tmp_path_factory.mktemp("spark-clusters")
    src = tmp / "logs"
    generate(src, events=1500, queues=6, days=0.1, gateways=2, processes=1, client_fraction=0.5)
    logs = [str(src / "gateway-*.jsonl"), "--client-log", str(src / "client-*.jsonl")]
    servers: list[Server] = []
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            local = pool.submit(run, [str(ANALYZE), *logs, "--out", str(tmp / "local-run")], tmp)
            standalone = pool.submit(start_standalone, tmp, servers)
            connect = pool.submit(start_connect, tmp, servers)
            ready = Clusters(tmp, standalone.result(), connect.result(), logs)
            local.result()
        yield ready
    finally:
        for server in reversed(servers):
            server.stop()


def check(clusters: Clusters, where: list[str], name: str, *, incremental: bool) -> None:
    batch = clusters.tmp / f"{name}-batch"
    steps = clusters.tmp / f"{name}-incremental" if incremental else None
    job = [sys.executable, "-m", "integration.pipeline._cluster_job"]
    run([*job, *where, str(batch), str(steps or ""), *clusters.logs], clusters.tmp)
    assert_same_tables(batch, clusters.local)
    if steps is not None:
        assert_same_tables(steps, clusters.local)


def test_standalone_cluster_gives_the_local_tables(clusters: Clusters) -> None:
    # The batch run only: an incremental step's code on a standalone cluster
    # is the local one's (a classic session), and the suite's time is short.
    check(clusters, ["--master", clusters.standalone], "standalone", incremental=False)


def test_spark_connect_gives_the_local_tables(clusters: Clusters) -> None:
    # Batch and --incremental: under Spark Connect the step takes its own
    # paths (no observed metrics, the server's executors write the tables).
    check(clusters, ["--remote", clusters.connect], "connect", incremental=True)
