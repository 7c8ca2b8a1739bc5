"""The compiled connection engine, and the pure-Python fallback.

The modules of the gateway's hot path (:data:`MODULES`: the connection
engine, the gateway hub and the routing mirror) are plain, fully typed
Python.  Building the wheel (``pip install rabbitflow``, ``python -m build``:
see ``setup.py``) compiles them with mypyc into extension modules installed
beside their sources, with a stamp (:data:`STAMP`) of the sources they were
built from; an editable install (``pip install -e .``) or
``scripts/build_accel.py`` compiles them in place.  Python imports the
compiled ones.  The sources stay the reference: the same tests pass on both,
and the gateway runs on the sources when

* nothing was compiled (the wheel was built without a C compiler),
* ``RABBITFLOW_PURE_PYTHON=1`` is set, or
* a source changed after the build (an edited checkout: the stamp holds a
  digest of the sources; a stale extension is never imported).

:func:`status` says which one runs; the gateway logs it at start.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Final

__all__ = [
    "MODULES",
    "PURE_ENV",
    "STAMP",
    "current_build",
    "digest",
    "extension_paths",
    "recorded_digest",
    "select",
    "status",
]

#: The compiled modules (of the package ``rabbitflow_broker``).
MODULES: Final = (
    "amqp",
    "amqp_encode",
    "cluster",
    "cluster_book",
    "confirms",
    "depth",
    "engine",
    "engine_channel",
    "engine_client",
    "engine_flow",
    "engine_io",
    "engine_pause",
    "engine_state",
    "engine_upstream",
    "gateway",
    "gateway_store",
    "gateway_views",
    "mirror",
    "read_pause",
    "relay_pump",
    "routing",
    "routing_exchange",
    "routing_match",
)
#: Set to 1 to run the pure-Python sources although a build is present.
PURE_ENV: Final = "RABBITFLOW_PURE_PYTHON"
#: Written by the build: the :func:`digest` of the sources it compiled.
STAMP: Final = "_accel.stamp"

_PACKAGE = "rabbitflow_broker"
_HERE = Path(__file__).resolve().parent
_status = "pure Python (not built)"


def digest(package_dir: Path = _HERE) -> str:
    """SHA-256 of the compiled modules' sources and the Python version."""
    h = hashlib.sha256(sys.version.encode())
    for name in MODULES:
        h.update(name.encode())
        h.update((package_dir / f"{name}.py").read_bytes())
    return h.hexdigest()


def extension_paths(package_dir: Path = _HERE) -> list[Path]:
    """The files a build makes besides its stamp: one extension per module
    and the group's shared library."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return [package_dir / f"{name}{suffix}" for name in (*MODULES, "_accel__mypyc")]


def recorded_digest(package_dir: Path = _HERE) -> str | None:
    """The digest a complete build recorded (current or stale), else None."""
    if not all(path.exists() for path in extension_paths(package_dir)):
        return None
    try:
        return (package_dir / STAMP).read_text().strip()
    except OSError:
        return None


def current_build(package_dir: Path = _HERE) -> bool:
    """Whether a complete build of the present sources is there."""
    return recorded_digest(package_dir) == digest(package_dir)


class _SourceFinder:
    """Resolves the compiled modules to their ``.py`` sources."""

    _names = frozenset(f"{_PACKAGE}.{name}" for name in MODULES)

    @classmethod
    def find_spec(
        cls, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in cls._names:
            return None
        source = _HERE / f"{fullname.rpartition('.')[2]}.py"
        return importlib.util.spec_from_file_location(fullname, source)


def select() -> str:
    """Choose compiled or pure modules (before any of them is imported)."""
    global _status
    recorded = recorded_digest()
    if recorded is None:
        _status = "pure Python (not built)"
        return _status
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _status = f"pure Python ({PURE_ENV} is set)"
    elif recorded != digest():
        _status = (
            "pure Python (the build is older than the sources: "
            "rebuild with scripts/build_accel.py or pip install .)"
        )
    else:
        _status = "compiled (mypyc)"
        return _status
    if _SourceFinder not in sys.meta_path:
        sys.meta_path.insert(0, _SourceFinder)
    return _status


def status() -> str:
    """Which engine runs: ``compiled (mypyc)`` or ``pure Python (why)``."""
    return _status


# Decide before the package imports any of the modules (its __init__ imports
# this module first).
select()
