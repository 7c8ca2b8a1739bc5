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
    "source_path",
    "status",
]

#: The compiled modules, dotted below the package ``rabbitflow_broker``.
MODULES: Final = (
    "engine.allowance",
    "engine.amqp",
    "engine.amqp_encode",
    "engine.channel",
    "engine.cluster",
    "engine.cluster_book",
    "engine.confirms",
    "engine.connection",
    "engine.depth",
    "engine.from_client",
    "engine.from_upstream",
    "engine.mirror",
    "engine.pause",
    "engine.ports",
    "engine.routing",
    "engine.routing_exchange",
    "engine.routing_match",
    "engine.state",
    "hub.admin_stops",
    "hub.gateway",
    "hub.ports",
    "hub.store_quota",
    "hub.views",
    "server.read_pause",
    "server.relay_pump",
)
#: Set to 1 to run the pure-Python sources although a build is present.
PURE_ENV: Final = "RABBITFLOW_PURE_PYTHON"
#: Written by the build: the :func:`digest` of the sources it compiled.
STAMP: Final = "_accel.stamp"

_PACKAGE = "rabbitflow_broker"
_HERE = Path(__file__).resolve().parent
_status = "pure Python (not built)"


def source_path(name: str, package_dir: Path = _HERE) -> Path:
    """The source file of the compiled module ``name`` (dotted below the package)."""
    return package_dir.joinpath(*name.split(".")).with_suffix(".py")


def digest(package_dir: Path = _HERE) -> str:
    """SHA-256 of the compiled modules' sources and the Python version."""
    h = hashlib.sha256(sys.version.encode())
    for name in MODULES:
        h.update(name.encode())
        h.update(source_path(name, package_dir).read_bytes())
    return h.hexdigest()


def extension_paths(package_dir: Path = _HERE) -> list[Path]:
    """The files a build makes besides its stamp: one extension per module
    and the group's shared library."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return [
        package_dir.joinpath(*name.split(".")).with_name(f"{name.rpartition('.')[2]}{suffix}")
        for name in (*MODULES, "_accel__mypyc")
    ]


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
        source = source_path(fullname.removeprefix(f"{_PACKAGE}."))
        return importlib.util.spec_from_file_location(fullname, source)


def select() -> str:
    """Choose compiled or pure modules (before any of them is imported)."""
    global _status
    recorded = recorded_digest()
    if recorded is None:
        # Not built, or not completely (a module added since the build):
        # the sources, even where an extension of an older build is left.
        _status = "pure Python (not built)"
    elif os.environ.get(PURE_ENV, "") not in ("", "0"):
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
