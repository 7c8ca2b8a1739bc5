"""The README's first program type-checks under ``mypy --strict``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _first_program() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A first program", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None
    return match.group(1)


def test_the_first_program_passes_mypy_strict(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    program = tmp_path / "first.py"
    program.write_text(_first_program())

    out, err, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(program),
        ]
    )

    assert status == 0, out + err
