"""A throwaway certificate authority made with the ``openssl`` command line.

``make_ca(directory)`` writes ``ca.pem``/``ca.key``; ``ca.issue(name)``
writes ``<name>.pem``/``<name>.key`` signed by it, valid for localhost and
127.0.0.1 (server and client use).  Nothing leaves ``directory``.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EXTENSIONS = """\
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
"""


def _openssl(*args: str | Path) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], check=False, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed: {result.stderr}")


@dataclass(frozen=True)
class Issued:
    """A certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA whose files live in ``directory``."""

    directory: Path
    cert: Path
    key: Path

    def issue(self, name: str, common_name: str = "localhost") -> Issued:
        """A certificate ``name`` for ``common_name`` (SAN localhost, 127.0.0.1)."""
        key = self.directory / f"{name}.key"
        request = self.directory / f"{name}.csr"
        cert = self.directory / f"{name}.pem"
        extensions = self.directory / f"{name}.ext"
        extensions.write_text(_EXTENSIONS)
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request,
                 "-subj", f"/CN={common_name}")  # fmt: skip
        _openssl("x509", "-req", "-in", request, "-CA", self.cert, "-CAkey", self.key,
                 "-CAcreateserial", "-out", cert, "-days", "2", "-sha256",
                 "-extfile", extensions)  # fmt: skip
        return Issued(cert, key)

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """A client context trusting this CA, presenting ``client`` when given."""
        context = ssl.create_default_context(cafile=str(self.cert))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        return context


def make_ca(directory: Path, name: str = "ca") -> CertificateAuthority:
    """A new self-signed CA in ``directory``; fails the test without ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.fail(
            "the openssl command line is not installed (apt-get install openssl; scripts/bootstrap)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
             "-days", "2", "-subj", f"/CN=rabbitflow test {name}", "-sha256",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return CertificateAuthority(directory, cert, key)
