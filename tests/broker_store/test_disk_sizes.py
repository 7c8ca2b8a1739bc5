"""Measuring vhost message stores on disk (``--store-path``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rabbitflow_broker.server.service import disk_store_sizes


def _store(root: Path, digest: str, vhost: str, files: dict[str, int]) -> None:
    directory = root / "mnesia" / "rabbit@h" / "msg_stores" / "vhosts" / digest
    (directory / "queues" / "Q1").mkdir(parents=True)
    (directory / ".vhost").write_text(vhost)
    for name, size in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(b"x" * size)


def test_sizes_are_summed_per_vhost_named_in_its_marker(tmp_path: Path) -> None:
    _store(tmp_path, "AAA", "/", {"msg_store_persistent/0.rdq": 300, "queues/Q1/journal": 20})
    _store(tmp_path, "BBB", "other", {"x.rdq": 7})
    sizes = disk_store_sizes(str(tmp_path))
    assert sizes == {"/": 320 + len("/"), "other": 7 + len("other")}


def test_missing_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="is not a directory"):
        disk_store_sizes(str(tmp_path / "absent"))
