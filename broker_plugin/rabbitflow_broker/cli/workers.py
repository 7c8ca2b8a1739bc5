"""``--workers N``: N gateway processes on one listen address, members of one cluster.

The command becomes a small supervisor.  It starts N ``rabbitflow-broker``
processes with the same options; they listen on the same ``--listen`` (and
``--listen-tls``) port with ``SO_REUSEPORT``, so the kernel spreads the
clients' connections over them, and they share one flow state as members of
one cluster (``--cluster NAME``, or :func:`cluster_name` when none is given).
Worker I serves its admin API on the ``--admin-listen`` port + I (port 0:
each picks a free one) and writes ``--event-log PATH`` as ``PATH-wI``
(:func:`worker_options`).

The supervisor forwards SIGTERM, SIGINT and SIGHUP to every worker, restarts
a worker that exits while no stop was asked for (after
:class:`RestartPolicy`'s backoff, logged), and returns once every worker has
stopped.  A worker that exits with status 2 (its options are refused) is not
restarted: the supervisor stops the others and returns 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from rabbitflow_broker.hub.config import GatewayConfig

__all__ = [
    "WORKER_ENV",
    "RestartPolicy",
    "Supervisor",
    "cluster_name",
    "worker_index",
    "worker_options",
]

_log = structlog.get_logger("rabbitflow.broker.workers")

#: Set in a worker's environment to its index (0..N-1): it serves instead of supervising.
WORKER_ENV = "RABBITFLOW_WORKER_INDEX"
#: Seconds past ``--drain-timeout`` that the supervisor waits before SIGKILL on stop.
STOP_GRACE_S = 15.0
#: Exit status of a process whose options are refused (the command's usage error).
USAGE_ERROR = 2


def worker_index(environ: dict[str, str] | None = None) -> int | None:
    """This process's worker index when a supervisor started it, else None."""
    value = (os.environ if environ is None else environ).get(WORKER_ENV)
    return int(value) if value is not None and value.isdigit() else None


def cluster_name(config: GatewayConfig, hostname: str | None = None) -> str:
    """``--cluster`` or, when none is given, one named after the host and listen port.

    The same command on the same host always picks the same name, so a
    restarted supervisor's workers join the cluster its earlier ones left.
    """
    if config.cluster:
        return config.cluster
    address = config.listen_address or config.listen_tls_address
    port = 0 if address is None else address[1]
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", hostname or socket.gethostname()) or "host"
    suffix = f"-{port}"
    return "workers-" + host[: 64 - len("workers-") - len(suffix)] + suffix


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def worker_options(config: GatewayConfig, index: int, cluster: str) -> list[str]:
    """The options a worker gets on top of the supervisor's own (later ones win)."""
    admin_host, admin_port = config.admin_address
    options = [
        "--cluster",
        cluster,
        "--admin-listen",
        _host_port(admin_host, admin_port + index if admin_port else 0),
    ]
    if config.event_log:
        path = Path(config.event_log)
        options += ["--event-log", str(path.with_name(f"{path.stem}-w{index}{path.suffix}"))]
    return options


@dataclass
class RestartPolicy:
    """How long to wait before restarting a worker that died (pure).

    The first restart waits ``initial`` seconds, each further one in a row
    twice as long, at most ``maximum``; a worker that had run for
    ``healthy_after`` seconds starts the series again.
    """

    initial: float = 0.5
    maximum: float = 30.0
    healthy_after: float = 30.0
    failures: int = field(default=0, init=False)

    def delay(self, ran_for: float) -> float:
        """Seconds to wait before restarting a worker that died after ``ran_for`` seconds."""
        if ran_for >= self.healthy_after:
            self.failures = 0
        self.failures += 1
        return min(self.maximum, self.initial * 2.0 ** (self.failures - 1))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGTERM when the supervisor dies (even by kill -9)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    """Runs the workers until a stop signal; ``await run()`` returns the exit status."""

    def __init__(
        self,
        config: GatewayConfig,
        argv: Sequence[str],
        *,
        policy_factory: type[RestartPolicy] = RestartPolicy,
    ) -> None:
        self.config = config
        self.argv = list(argv)
        self.cluster = cluster_name(config)
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self._policies = [policy_factory() for _ in range(config.workers)]
        self._stopping = asyncio.Event()
        self._status = 0
        self._tasks: list[asyncio.Task[None]] = []

    def command(self, index: int) -> list[str]:
        """The argument vector of worker ``index``."""
        return [
            sys.executable,
            "-m",
            "rabbitflow_broker.cli",
            *self.argv,
            *worker_options(self.config, index, self.cluster),
        ]

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        admin_host, admin_port = self.config.admin_address
        _log.info(
            "starting workers",
            workers=self.config.workers,
            cluster=self.cluster,
            listen=self.config.listen,
            admin=(
                f"{_host_port(admin_host, admin_port)}..{admin_port + self.config.workers - 1}"
                if admin_port
                else f"{_host_port(admin_host, 0)} (each worker picks a free port)"
            ),
        )
        self._tasks = [
            asyncio.create_task(self._keep(index), name=f"worker-{index}")
            for index in range(self.config.workers)
        ]
        await asyncio.gather(*self._tasks)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        _log.info("all workers stopped", status=self._status)
        return self._status

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop every worker with ``sig`` and restart none."""
        if not self._stopping.is_set():
            _log.info("stopping workers", signal=signal.Signals(sig).name)
        self._stopping.set()
        self._forward(sig)

    def _forward(self, sig: int) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def _start(self, index: int) -> asyncio.subprocess.Process:
        env = dict(os.environ)
        env[WORKER_ENV] = str(index)
        process = await asyncio.create_subprocess_exec(
            *self.command(index),
            env=env,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.processes[index] = process
        _log.info("worker started", worker=index, pid=process.pid)
        return process

    async def _keep(self, index: int) -> None:
        """Run worker ``index``, restarting it after a death, until a stop."""
        while not self._stopping.is_set():
            started = time.monotonic()
            process = await self._start(index)
            status = await self._wait(process)
            if self._stopping.is_set():
                _log.info("worker stopped", worker=index, pid=process.pid, status=status)
                return
            if status == USAGE_ERROR:
                _log.error(
                    "worker refused its options; stopping the others",
                    worker=index,
                    pid=process.pid,
                )
                self._status = USAGE_ERROR
                self.stop()
                return
            ran_for = time.monotonic() - started
            delay = self._policies[index].delay(ran_for)
            how = (
                f"killed by {signal.Signals(-status).name}"
                if status < 0 and -status in signal.valid_signals()
                else f"exit status {status}"
            )
            _log.warning(
                "worker died; restarting it",
                worker=index,
                pid=process.pid,
                how=how,
                ran_for_s=round(ran_for, 1),
                restart_in_s=delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _wait(self, process: asyncio.subprocess.Process) -> int:
        """The worker's exit status; SIGKILL when it outlives a stop by too long."""
        waiter = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiter, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                grace = self.config.drain_timeout / 1000 + STOP_GRACE_S
                done, _ = await asyncio.wait({waiter}, timeout=grace)
                if not done:
                    _log.error("worker did not stop in time: killing it", pid=process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            return await waiter
        finally:
            stopping.cancel()
