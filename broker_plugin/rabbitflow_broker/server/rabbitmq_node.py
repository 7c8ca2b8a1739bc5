"""Throwaway RabbitMQ nodes and AMQP readiness probes.

A :class:`RabbitMQNode` runs Debian's ``rabbitmq-server`` as a private node:
its own node name, AMQP, distribution and management ports, Mnesia and log
directories, config file and Erlang cookie, all under one temporary
directory.  The integration tests use it for anything that stops, restarts
or alarms a broker, and the demo uses it when no RabbitMQ is reachable.  It
never touches the machine's shared node.

Raises :class:`NodeError` when the node cannot be started or controlled.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from rabbitflow_broker.engine.errors import OutsideError

__all__ = [
    "NodeError",
    "RabbitMQNode",
    "amqp_handshake_ok",
    "free_port",
    "rabbitmq_available",
    "wait_for_amqp",
]

_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_RABBIT_BIN_DIRS = ("/usr/lib/rabbitmq/bin", "/usr/sbin", "/usr/local/sbin", "/opt/rabbitmq/sbin")


class NodeError(OutsideError, RuntimeError):
    """A throwaway RabbitMQ node could not be started, stopped or controlled."""


def amqp_handshake_ok(host: str, port: int, timeout: float = 2.0) -> bool:
    """Return True when something at host:port answers the AMQP 0-9-1 header.

    The peer must answer with a method frame (``Connection.Start``); an open
    port that does not speak AMQP does not count.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_PROTOCOL_HEADER)
            data = b""
            while len(data) < 7:
                chunk = sock.recv(7 - len(data))
                if not chunk:
                    return False
                data += chunk
            # frame type 1 (method) on channel 0
            return data[0] == 1 and data[1:3] == b"\x00\x00"
    except OSError:
        return False


def wait_for_amqp(host: str, port: int, deadline_s: float) -> None:
    """Block until host:port answers an AMQP handshake.

    Raises:
        NodeError: when it has not answered within ``deadline_s`` seconds.
    """
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if amqp_handshake_ok(host, port, timeout=1.0):
            return
        time.sleep(0.2)
    raise NodeError(f"no AMQP handshake from {host}:{port} within {deadline_s:.0f} s")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now, drawn from
    :data:`_NODE_PORTS` (below the ephemeral range: no outgoing connection
    takes it before the process it is meant for listens, or listens again)."""
    return _node_ports(1)[0]


def _rabbit_bin(name: str) -> str | None:
    for directory in _RABBIT_BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            # Debian's /usr/sbin wrapper su's to the rabbitmq user; the real
            # script in /usr/lib/rabbitmq/bin runs as whoever calls it.
            return str(candidate)
    return shutil.which(name)


def rabbitmq_available() -> bool:
    """Return True when a ``rabbitmq-server`` binary is installed here."""
    return _rabbit_bin("rabbitmq-server") is not None


#: Where a node's ports are drawn from: below Linux's default range of
#: ephemeral ports (32768-60999), which the kernel hands to outgoing
#: connections.  A node's ports are free while it is stopped; drawn from
#: that range, one of them could be taken by any connection made meanwhile,
#: and the restarted node would then fail to listen (``eaddrinuse``).
_NODE_PORTS = range(20000, 32768)
#: RabbitMQ's shared defaults (AMQP, management, distribution, epmd).
_RESERVED_PORTS = frozenset({5672, 15672, 25672, 4369})


def _node_ports(count: int) -> list[int]:
    """``count`` distinct ports of :data:`_NODE_PORTS` that are free right now."""
    chosen: list[int] = []
    rng = random.SystemRandom()
    while len(chosen) < count:
        port = rng.choice(_NODE_PORTS)
        if port in _RESERVED_PORTS or port in chosen:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    return chosen


class RabbitMQNode:
    """A private RabbitMQ node in a temporary directory.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    ``management=True`` enables the management plugin on its own port.
    """

    def __init__(
        self,
        *,
        management: bool = False,
        extra_config: Sequence[str] = (),
        base_dir: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 60.0,
        cookie: str | None = None,
    ) -> None:
        if not rabbitmq_available():
            raise NodeError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.name = f"rf-{uuid.uuid4().hex[:10]}@localhost"
        ports = _node_ports(3)
        self.amqp_port, self.dist_port = ports[0], ports[1]
        self.management_port = ports[2] if management else None
        self._owns_dir = base_dir is None
        self.base = Path(base_dir or tempfile.mkdtemp(prefix="rabbitflow-node-"))
        self.management = management
        self.extra_config = tuple(extra_config)
        self.start_timeout_s = start_timeout_s
        #: The Erlang cookie (nodes that share one can form a RabbitMQ cluster).
        self.cookie = cookie or uuid.uuid4().hex.upper()
        self._process: subprocess.Popen[bytes] | None = None
        self._write_files()

    # -- public -----------------------------------------------------------
    @property
    def url(self) -> str:
        """AMQP URL of the node (guest/guest, default vhost)."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def management_url(self) -> str | None:
        """HTTP URL of the node's management API, or None."""
        if self.management_port is None:
            return None
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> RabbitMQNode:
        """Start the node and wait until it answers an AMQP handshake.

        Raises:
            NodeError: the node exited or did not answer in time.
        """
        if self.running:
            return self
        log = (self.base / "server.out").open("ab")
        server = _rabbit_bin("rabbitmq-server")
        assert server is not None
        self._process = subprocess.Popen(
            [server],
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.base,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NodeError(
                    f"node {self.name} exited with {self._process.returncode}: {self._tail_log()}"
                )
            if amqp_handshake_ok("127.0.0.1", self.amqp_port, timeout=1.0):
                if self.management_port is not None:
                    self._wait_management(deadline)
                return self
            time.sleep(0.2)
        self.kill()
        raise NodeError(f"node {self.name} did not start in {self.start_timeout_s:.0f} s")

    def stop(self) -> None:
        """Stop the node gracefully (``rabbitmqctl stop``), killing it if needed."""
        if self._process is None:
            return
        if self._process.poll() is None:
            with contextlib.suppress(NodeError):
                self.ctl("stop", timeout_s=30)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._process = None

    def kill(self) -> None:
        """Kill the node's process group at once (a crash, not a shutdown)."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        self._process = None

    def restart(self) -> None:
        """Stop the node and start it again with the same data and ports."""
        self.stop()
        self.start()

    def ctl(self, *args: str, timeout_s: float = 60) -> str:
        """Run ``rabbitmqctl -n NODE ARGS...`` and return its output.

        Raises:
            NodeError: rabbitmqctl failed or timed out.
        """
        ctl = _rabbit_bin("rabbitmqctl")
        if ctl is None:
            raise NodeError("rabbitmqctl is not installed")
        try:
            done = subprocess.run(
                [ctl, "-n", self.name, *args],
                env=self._env(),
                capture_output=True,
                timeout=timeout_s,
                cwd=self.base,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise NodeError(f"rabbitmqctl {' '.join(args)} timed out") from exc
        if done.returncode != 0:
            raise NodeError(
                f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
                f"{done.stderr.decode(errors='replace').strip()}"
            )
        return done.stdout.decode(errors="replace")

    def join(self, other: RabbitMQNode) -> None:
        """Join ``other``'s RabbitMQ cluster (both running, same cookie)."""
        self.ctl("stop_app")
        self.ctl("join_cluster", other.name)
        self.ctl("start_app")
        if not amqp_handshake_ok("127.0.0.1", self.amqp_port, timeout=30):
            raise NodeError(f"node {self.name} did not come back after joining {other.name}")

    def close(self) -> None:
        """Stop the node and remove its directory (if this object made it)."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> RabbitMQNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RabbitMQNode(name={self.name!r}, amqp_port={self.amqp_port}, running={self.running})"
        )

    # -- internals --------------------------------------------------------
    def _write_files(self) -> None:
        (self.base / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.base / "log").mkdir(exist_ok=True)
        lines = [
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}",
            "loopback_users = none",
            "log.console = false",
            "log.file.level = info",
        ]
        if self.management_port is not None:
            lines += [
                f"management.tcp.port = {self.management_port}",
                "management.tcp.ip = 127.0.0.1",
            ]
        lines += list(self.extra_config)
        (self.base / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        plugins = "[rabbitmq_management]." if self.management else "[]."
        (self.base / "enabled_plugins").write_text(plugins + "\n")
        cookie = self.base / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.base),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base / "log"),
            RABBITMQ_CONFIG_FILE=str(self.base / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.base / "rabbit.pid"),
            RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.base / "advanced.config"),
        )
        return env

    def _wait_management(self, deadline: float) -> None:
        import urllib.error
        import urllib.request

        assert self.management_url is not None
        request = urllib.request.Request(f"{self.management_url}/api/overview")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise NodeError(f"management API of {self.name} did not answer in time")

    def _tail_log(self) -> str:
        try:
            return (self.base / "server.out").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def host_port(url: str) -> tuple[str, int]:
    """Host and port of an amqp:// URL (5672 when the URL names none)."""
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or 5672
