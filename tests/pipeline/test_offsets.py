"""Per-file offsets: appended lines, rotated, truncated and half-written files."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from rabbitflow_pipeline import checkpoint as checkpoint_module
from rabbitflow_pipeline.checkpoint import Checkpoint, exclusive, stage, staged_paths
from rabbitflow_pipeline.offsets import (
    FileRead,
    InputChanged,
    Tracked,
    copy_range,
    observe,
    plan_reads,
)
from rabbitflow_pipeline.readers import stream_of


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
    st = source.stat()
    copy_range(str(source), 5, 9005, target, (st.st_dev, st.st_ino))
    assert target.read_bytes() == (b"0123456789" * 1000)[5:9005]


def test_copy_range_refuses_a_file_that_changed_since_it_was_observed(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"a\nb\n")
    st = log.stat()
    identity = (st.st_dev, st.st_ino)
    os.rename(log, tmp_path / "events.jsonl.1")  # rotated between observe and copy
    with pytest.raises(InputChanged, match="is gone"):
        copy_range(str(log), 0, 4, tmp_path / "copy", identity)
    log.write_bytes(b"a longer new file\n")
    with pytest.raises(InputChanged, match="another file"):
        copy_range(str(log), 0, 4, tmp_path / "copy", identity)
    rotated = tmp_path / "events.jsonl.1"
    with pytest.raises(InputChanged, match="shorter"):
        copy_range(str(rotated), 0, 40, tmp_path / "copy", identity)


def test_a_directory_is_read_as_its_files_and_a_mistyped_path_fails_the_first_step(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "gw-1.jsonl").write_bytes(b"a\n")
    (logs / "gw-2.jsonl").write_bytes(b"bb\n")
    (logs / ".hidden").write_bytes(b"x\n")
    (logs / "_SUCCESS").write_bytes(b"")
    reads, tracked = step([], str(logs))
    assert ranges(reads) == {"gw-1.jsonl": (0, 2), "gw-2.jsonl": (0, 3)}
    with pytest.raises(FileNotFoundError, match=r"gw-3\.jsonl: no such file"):
        step([], str(logs / "gw-3.jsonl"))
    # Once something was read, a missing file is one rotated away: no error.
    reads, _ = step(tracked, str(logs), str(logs / "gw-3.jsonl"))
    assert ranges(reads) == {"gw-1.jsonl": (2, 2), "gw-2.jsonl": (3, 3)}
    # A glob that matches nothing yet contributes nothing, even at the first step.
    assert step([], str(tmp_path / "later-*.log")) == ([], [])


def test_a_compressed_rotated_log_is_left_out_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "events.jsonl").write_bytes(b"a\n")
    (tmp_path / "events.jsonl.2.gz").write_bytes(gzip.compress(b"old\n"))
    with caplog.at_level("WARNING", logger="rabbitflow_pipeline.offsets"):
        reads, _ = step([], str(tmp_path / "events.jsonl*"))
    assert ranges(reads) == {"events.jsonl": (0, 2)}
    assert "events.jsonl.2.gz: compressed, not read" in caplog.text
    caplog.clear()  # the next step (a --follow trigger) says it no more
    with caplog.at_level("WARNING", logger="rabbitflow_pipeline.offsets"):
        reads, _ = step([], str(tmp_path / "events.jsonl*"))
    assert ranges(reads) == {"events.jsonl": (0, 2)}
    assert "compressed" not in caplog.text


def test_a_fifo_among_the_inputs_is_passed_over_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_bytes(b"a\n")
    os.mkfifo(tmp_path / "events.jsonl.pipe")
    os.mkdir(tmp_path / "events.jsonl.d")
    reads, _ = step([], str(tmp_path / "events.jsonl*"))
    assert ranges(reads) == {"events.jsonl": (0, 2)}


def test_one_file_under_two_names_is_read_once(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"a\nb\n")
    os.link(log, tmp_path / "events.jsonl.1")  # as a rename under way shows it for a moment
    reads, _ = step([], str(tmp_path / "events.jsonl*"))
    assert ranges(reads) == {"events.jsonl": (0, 4)}


def test_staging_observes_again_when_a_file_is_rotated_under_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    log = live / "events.jsonl"
    log.write_bytes(b"one\ntwo\n")
    copies = []
    real_copy = checkpoint_module.copy_range

    def rotating_copy(source: str, *args: object) -> None:
        if not copies:  # the gateway rotates its log right after the inputs were observed
            os.rename(log, live / "events.jsonl.1")
            log.write_bytes(b"three\n")
        copies.append(source)
        real_copy(source, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint_module, "copy_range", rotating_copy)
    out = tmp_path / "out"
    manifest = stage(out, Checkpoint(), [("events", str(live / "events.jsonl*"))])
    # The first copy found the file renamed away; the inputs were observed
    # again and both files copied, each once.
    assert len(copies) == 3
    staged = staged_paths(out, manifest["batch"], manifest["parts"])
    assert sorted(Path(p).read_bytes() for p in staged) == [b"one\ntwo\n", b"three\n"]
    # Both parts are one log: the rotated copy counts as the file it was.
    assert {part["source"] for part in manifest["parts"]} == {log.as_uri()}


def test_a_rotated_copy_is_the_stream_it_was_rotated_from() -> None:
    assert stream_of("file:///var/log/events.jsonl.1") == "file:///var/log/events.jsonl"
    assert stream_of("file:///var/log/events.jsonl.12") == "file:///var/log/events.jsonl"
    assert stream_of("file:///var/log/events.jsonl") == "file:///var/log/events.jsonl"
    assert stream_of("file:///var/log/gw-1.jsonl") == "file:///var/log/gw-1.jsonl"


def test_steps_on_one_output_take_turns(tmp_path: Path) -> None:
    out = tmp_path / "out"
    entered = threading.Event()

    def second_step() -> None:
        with exclusive(out):
            entered.set()

    with exclusive(out):
        other = threading.Thread(target=second_step, daemon=True)
        other.start()
        # The second step waits for the lock (its own open of the lock file).
        assert not entered.wait(0.5)
    assert entered.wait(10), "the second step never got the lock"
    other.join(10)
