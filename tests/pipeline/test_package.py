"""The --py-files zip holds the pipeline and only the gateway's event classes."""

from __future__ import annotations

import zipfile
from pathlib import Path

from rabbitflow_pipeline.package import build_py_files


def test_py_files_zip_holds_the_pipeline_and_the_event_classes(tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(build_py_files(tmp_path / "dist" / "rf.zip")).namelist())
    assert {
        "rabbitflow_pipeline/__init__.py",
        "rabbitflow_pipeline/cli.py",
        "rabbitflow_pipeline/pairing.py",
        "rabbitflow_broker/__init__.py",
        "rabbitflow_broker/events.py",
    } <= names
    assert not any(
        n.startswith("rabbitflow_broker/") and n.endswith(("service.py", "config.py"))
        for n in names
    )
