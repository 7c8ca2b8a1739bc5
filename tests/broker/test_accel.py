"""The compiled engine and its pure-Python fallback (rabbitflow_broker.accel)."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rabbitflow_broker
from rabbitflow_broker import accel

PACKAGE = Path(rabbitflow_broker.__path__[0])
ROOT = PACKAGE.parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
PROBE = (
    "import sys, rabbitflow_broker.accel as a, rabbitflow_broker.engine.connection as e; "
    "print(e.__file__); print(a.status()); "
    "print(any(m in sys.modules for m in ('asyncio', 'socket')))"
)


def _environ(**extra: str) -> dict[str, str]:
    """This process's environment without the pure-Python switch, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if k != accel.PURE_ENV}
    return {**base, **extra}


def _probe(env: dict[str, str]) -> tuple[str, str, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=_environ(**env),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split("\n")
    return out[0], out[1], out[2]


def test_status_names_the_modules_actually_imported() -> None:
    from rabbitflow_broker.engine import connection as engine

    forced_pure = os.environ.get(accel.PURE_ENV, "") not in ("", "0")
    if accel.current_build() and not forced_pure:
        assert accel.status() == "compiled (mypyc)"
        assert str(engine.__file__).endswith(SUFFIX)
    else:
        assert accel.status().startswith("pure Python")
        assert str(engine.__file__).endswith(".py")


def test_pure_env_imports_the_sources_and_no_event_loop() -> None:
    path, status, loop_imported = _probe({accel.PURE_ENV: "1"})
    assert path == str(PACKAGE / "engine" / "connection.py")
    built = accel.recorded_digest() is not None  # current or stale
    assert status == (
        f"pure Python ({accel.PURE_ENV} is set)" if built else "pure Python (not built)"
    )
    assert loop_imported == "False"


def _package_copy(tmp_path: Path, stamp: str) -> dict[str, str]:
    """The package's sources in tmp_path with an unloadable 'extension' for
    every compiled module: importing one of them would fail."""
    copy = tmp_path / "rabbitflow_broker"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns(f"*{SUFFIX}", "__pycache__"))
    for path in accel.extension_paths(copy):
        path.write_bytes(b"not an extension module")
    (copy / accel.STAMP).write_text(stamp + "\n")
    return {"PYTHONPATH": str(tmp_path)}


def test_a_build_older_than_the_sources_is_never_imported(tmp_path: Path) -> None:
    env = _package_copy(tmp_path, "0" * 64)
    path, status, _ = _probe(env)
    assert path == str(tmp_path / "rabbitflow_broker" / "engine" / "connection.py")
    assert status == (
        "pure Python (the build is older than the sources: "
        "rebuild with scripts/build_accel.py or pip install .)"
    )


def test_a_current_build_is_imported_unless_the_pure_env_is_set(tmp_path: Path) -> None:
    env = _package_copy(tmp_path, accel.digest(PACKAGE))
    # The stamp matches: Python loads the (here unloadable) extension.
    failed = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=_environ(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode != 0
    assert "ImportError" in failed.stderr
    path, status, _ = _probe({**env, accel.PURE_ENV: "1"})
    assert path == str(tmp_path / "rabbitflow_broker" / "engine" / "connection.py")
    assert status == f"pure Python ({accel.PURE_ENV} is set)"


@pytest.mark.slow  # runs the engine's and the hub's unit tests once more
@pytest.mark.skipif(
    not accel.current_build(), reason="the engine is not compiled: this run is pure"
)
def test_the_engine_suite_passes_on_the_pure_python_sources() -> None:
    """The engine's and the hub's unit tests, run on the sources while the
    compiled build is present."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/broker",
            "tests/broker_store",
            "--ignore=tests/broker/test_accel.py",
        ],
        cwd=ROOT,
        env={**os.environ, accel.PURE_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout.splitlines()[-1]
