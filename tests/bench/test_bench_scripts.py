"""Every benchmark starts the way docs/performance.md runs it.

The benches are scripts, run as ``.venv/bin/python bench/NAME.py``, outside
the packages that mypy and the other tests import: an import one of them
lost (a helper moved to ``bench/_common.py``, a script that needs the
repository on its path) would otherwise show only when someone next runs
it.  ``--help`` imports the whole script and parses its arguments, and
starts nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))


def test_there_are_benches_to_check() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_bench_starts_as_documented(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script.relative_to(ROOT)), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
