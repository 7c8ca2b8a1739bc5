"""Per-file offsets: appended lines, rotated, truncated and half-written files."""

from __future__ import annotations

import os
from pathlib import Path

from rabbitflow_pipeline.offsets import FileRead, Tracked, copy_range, observe, plan_reads


def step(tracked: list[Tracked], *patterns: str) -> tuple[list[FileRead], list[Tracked]]:
    reads = plan_reads(tracked, observe([("events", p) for p in patterns], tracked))
    return reads, [r.tracked for r in reads]


def ranges(reads: list[FileRead]) -> dict[str, tuple[int, int]]:
    return {Path(r.path).name: (r.start, r.end) for r in reads}


def test_reads_appended_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"one\ntwo\nthr")
    reads, tracked = step([], str(log))
    assert ranges(reads) == {"events.jsonl": (0, 8)}
    with log.open("ab") as handle:
        handle.write(b"ee\nfour\n")
    reads, tracked = step(tracked, str(log))
    assert ranges(reads) == {"events.jsonl": (8, 19)}
    reads, tracked = step(tracked, str(log))
    assert ranges(reads) == {"events.jsonl": (19, 19)}


def test_a_rotated_file_is_read_on_and_its_successor_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"a\nb\n")
    pattern = str(tmp_path / "events.jsonl*")
    _, tracked = step([], pattern)
    with log.open("ab") as handle:
        handle.write(b"c\n")  # appended before the rotation
    os.rename(log, tmp_path / "events.jsonl.1")
    log.write_bytes(b"d\n")
    reads, _ = step(tracked, pattern)
    assert ranges(reads) == {"events.jsonl": (0, 2), "events.jsonl.1": (4, 6)}


def test_a_truncated_or_rewritten_file_starts_over(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"first line\nsecond line\n")
    _, tracked = step([], str(log))
    with log.open("r+b") as handle:  # same inode, shorter
        handle.truncate(0)
        handle.write(b"new\n")
    reads, tracked = step(tracked, str(log))
    assert ranges(reads) == {"events.jsonl": (0, 4)}
    with log.open("r+b") as handle:  # same inode, longer, other first bytes
        handle.write(b"NEW\nmore lines than before\n")
    reads, _ = step(tracked, str(log))
    assert ranges(reads) == {"events.jsonl": (0, 27)}


def test_copy_range_copies_exactly_the_range(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"0123456789" * 1000)
    target = tmp_path / "copy"
    copy_range(str(source), 5, 9005, target)
    assert target.read_bytes() == (b"0123456789" * 1000)[5:9005]
