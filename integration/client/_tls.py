"""A throwaway CA and a TLS-terminating TCP proxy in front of RabbitMQ, so the
SDK's ``amqps://`` path is exercised against the real broker.

The certificates are made with the ``openssl`` command line tool.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ThrowawayCA:
    """A CA certificate and a server certificate (127.0.0.1, localhost) it signed."""

    ca_file: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str = "rabbitflow-test-ca") -> ThrowawayCA:
    """Create a CA and a server certificate for 127.0.0.1 in ``directory``.

    Raises:
        RuntimeError: ``openssl`` is not installed.
    """
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-keyout", "ca.key", "-out", "ca.pem", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=directory,
    )  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext",
        cwd=directory,
    )  # fmt: skip
    return ThrowawayCA(directory / "ca.pem", directory / "server.pem", directory / "server.key")


class TlsProxy:
    """Accepts TLS on 127.0.0.1 and relays the plain bytes to ``upstream``."""

    def __init__(self, ca: ThrowawayCA, upstream: tuple[str, int]) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(ca.server_cert, ca.server_key)
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="tls-proxy", daemon=True).start()

    def url(self, vhost: str = "%2F") -> str:
        """The amqps:// URL of the proxy."""
        return f"amqps://guest:guest@127.0.0.1:{self.port}/{vhost}"

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> TlsProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                raw, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # the client refused our certificate: nothing to relay
            return
        upstream = socket.create_connection(self._upstream)
        with self._lock:
            self._sockets += [client, upstream]
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        self._pump(upstream, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()
