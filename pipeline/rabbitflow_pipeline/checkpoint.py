"""What the incremental job keeps under ``--out/_state``: the checkpoint, staged input, cleanup.

Layout under ``--out``::

    _state/commit.json         the checkpoint (:class:`Checkpoint`): offsets,
                               counters, which state and table files are current
    _state/staging/batch-N/    the new lines of step N, copied before parsing
    _state/state/vN/           after step N: the opening event of every open
                               interval, the events not yet settled, and the
                               last transitions of each queue (duplicate test)
    _state/channels/vN/        after step N: every channel blocked on a queue,
                               with its count of settled blocks
    _state/stats/vN/           after step N: per queue, the statistics of its
                               settled episodes (counts, time overfull, sorted
                               durations and drain rates, latest thresholds)
    events/batch=N/            the parsed events of step N (Parquet event store)
    episodes/ channel_blocks/ store_episodes/
                               one file set per step of settled rows (``b...``),
                               plus the current step's provisional rows (``p...``)
    queue_summary/ advice/ send_delays/ malformed/
                               rewritten each step from the stored state (``r...``)

A step writes everything under names of its own step number, then
replaces ``commit.json`` (the one commit point); :func:`clean` deletes
whatever a killed step left that the checkpoint does not name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from rabbitflow_pipeline.offsets import InputChanged, Tracked, copy_range, observe, plan_reads
from rabbitflow_pipeline.readers import stream_of

__all__ = [
    "INTERVAL_TABLES",
    "REWRITTEN_TABLES",
    "STATE_DIR",
    "Checkpoint",
    "clean",
    "commit",
    "exclusive",
    "load_checkpoint",
    "load_manifest",
    "source_column",
    "stage",
    "staged_paths",
    "write_text_atomically",
]

_log = logging.getLogger(__name__)

#: Directory under ``--out`` holding the checkpoint and the stored state.
STATE_DIR = "_state"
#: Tables whose settled rows are kept per step and whose open rows are replaced.
INTERVAL_TABLES = ("episodes", "channel_blocks", "store_episodes")
#: Tables rewritten whole at every step (from the stored state; they are small).
REWRITTEN_TABLES = ("queue_summary", "advice", "send_delays", "malformed")

_COMMIT = "commit.json"
_MANIFEST = "_manifest.json"
_LOCK = "lock"
_STATE_AREAS = ("state", "channels", "stats", "tmp")
#: Times the inputs are observed and copied again when one changes under the copy.
_STAGE_ATTEMPTS = 5


@dataclass(frozen=True)
class Checkpoint:
    """What the last committed step left: the content of ``_state/commit.json``."""

    batch: int = -1
    files: tuple[Tracked, ...] = ()
    frontier_us: int | None = None
    window_start_us: int | None = None
    window_end_us: int | None = None
    lines: int = 0
    malformed: int = 0
    ignored: int = 0
    late: int = 0
    #: ``_state``-relative directory of the open starts, unsettled events and context.
    state: str | None = None
    #: ``_state``-relative directory of the blocked channels.
    channels: str | None = None
    #: ``_state``-relative directory of the per-queue statistics of the settled
    #: episodes (none before a step settled one, nor in a checkpoint written
    #: before it was kept).
    stats: str | None = None
    #: Table name to its current files (relative to the table directory).
    tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Counts over the settled rows and the client records read so far
    #: (rows per interval table, histogram buckets of settled blocks and of delays).
    counters: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "files": [f.to_json() for f in self.files],
            "frontier_us": self.frontier_us,
            "window_start_us": self.window_start_us,
            "window_end_us": self.window_end_us,
            "lines": self.lines,
            "malformed": self.malformed,
            "ignored": self.ignored,
            "late": self.late,
            "state": self.state,
            "channels": self.channels,
            "stats": self.stats,
            "tables": {k: list(v) for k, v in self.tables.items()},
            "counters": dict(self.counters),
        }

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Checkpoint:
        return Checkpoint(
            batch=int(doc["batch"]),
            files=tuple(Tracked.from_json(f) for f in doc["files"]),
            frontier_us=doc["frontier_us"],
            window_start_us=doc["window_start_us"],
            window_end_us=doc["window_end_us"],
            lines=int(doc["lines"]),
            malformed=int(doc["malformed"]),
            ignored=int(doc["ignored"]),
            late=int(doc["late"]),
            state=doc["state"],
            channels=doc.get("channels"),
            stats=doc.get("stats"),
            tables={k: tuple(v) for k, v in doc["tables"].items()},
            counters={k: int(v) for k, v in doc.get("counters", {}).items()},
        )


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(out: Path) -> Checkpoint:
    """The last committed checkpoint under ``out`` (an empty one before the first step)."""
    path = out / STATE_DIR / _COMMIT
    if not path.exists():
        return Checkpoint()
    return Checkpoint.from_json(json.loads(path.read_text(encoding="utf-8")))


def commit(out: Path, checkpoint: Checkpoint) -> None:
    """Make ``checkpoint`` the committed one (one atomic file replacement)."""
    write_text_atomically(out / STATE_DIR / _COMMIT, json.dumps(checkpoint.to_json(), indent=1))


def _batch_of(name: str) -> int | None:
    return int(name) if name.isdigit() else None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean(out: Path, checkpoint: Checkpoint, *, keep_staging: int | None) -> None:
    """Delete whatever the checkpoint does not name (a killed step's leftovers, old state)."""
    root = out / STATE_DIR
    named = {checkpoint.state, checkpoint.channels, checkpoint.stats}
    for area in _STATE_AREAS:
        base = root / area
        if base.is_dir():
            for child in base.iterdir():
                if f"{area}/{child.name}" not in named:
                    _remove(child)
    staging = root / "staging"
    if staging.is_dir():
        for child in staging.iterdir():
            if keep_staging is None or child.name != f"batch-{keep_staging:08d}":
                _remove(child)
    events = out / "events"
    if events.is_dir():
        for child in events.iterdir():
            batch = _batch_of(child.name.removeprefix("batch="))
            if child.name.startswith("batch=") and (batch is None or batch > checkpoint.batch):
                _remove(child)
    for table in (*INTERVAL_TABLES, *REWRITTEN_TABLES):
        directory = out / table
        if directory.is_dir():
            listed = set(checkpoint.tables.get(table, ()))
            for child in directory.iterdir():
                if child.name not in listed:
                    _remove(child)


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold ``out``'s step lock: one step at a time on one ``--out``.

    A ``--follow`` and a scheduled ``--incremental`` on the same output take
    turns instead of deleting each other's uncommitted files.  The lock is
    the kernel's (``flock``): a killed process leaves none behind.  Waits,
    saying so once, while another step holds it.
    """
    root = out / STATE_DIR
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("%s: another step is running on it; waiting for it to finish", out)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _staging(out: Path, batch: int) -> Path:
    return out / STATE_DIR / "staging" / f"batch-{batch:08d}"


def stage(out: Path, checkpoint: Checkpoint, patterns: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Copy the new whole lines of every input into the next step's staging directory.

    Returns the manifest (also written, last, as ``_manifest.json``); a
    step killed before that starts its staging over.  A file that changes
    between being observed and being copied (a rotation under way) has the
    inputs observed and copied again.

    Raises:
        FileNotFoundError: see :func:`~rabbitflow_pipeline.offsets.observe`.
        InputChanged: the inputs kept changing under the copy.
    """
    patterns = list(patterns)
    for attempt in range(_STAGE_ATTEMPTS):
        try:
            return _stage_once(out, checkpoint, patterns)
        except InputChanged:
            if attempt == _STAGE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _stage_once(
    out: Path, checkpoint: Checkpoint, patterns: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    batch = checkpoint.batch + 1
    staging = _staging(out, batch)
    shutil.rmtree(staging, ignore_errors=True)
    reads = plan_reads(checkpoint.files, observe(patterns, checkpoint.files))
    parts: list[dict[str, Any]] = []
    fresh = [r for r in reads if r.end > r.start]
    if fresh:
        staging.mkdir(parents=True)
    for index, read in enumerate(fresh):
        identity = (read.tracked.dev, read.tracked.ino)
        copy_range(read.path, read.start, read.end, staging / f"{index:06d}.log", identity)
        parts.append(
            {
                "index": index,
                "kind": read.kind,
                "source": stream_of(Path(read.path).as_uri()),
                "start": read.start,
                "end": read.end,
            }
        )
    manifest = {"batch": batch, "files": [r.tracked.to_json() for r in reads], "parts": parts}
    if fresh:
        write_text_atomically(staging / _MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def load_manifest(out: Path, batch: int) -> dict[str, Any] | None:
    """The manifest step ``batch`` staged, if its staging finished."""
    path = _staging(out, batch) / _MANIFEST
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def source_column(parts: Sequence[Mapping[str, Any]]) -> Column:
    """The original file's log for a row of a staged copy (as the batch job's ``source``)."""
    index = F.regexp_extract(F.input_file_name(), r"(\d{6})\.log$", 1).cast("int")
    mapping = F.create_map(
        *(x for p in parts for x in (F.lit(int(p["index"])), F.lit(str(p["source"]))))
    )
    return mapping[index]


def staged_paths(out: Path, batch: int, parts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The staged copies of ``parts`` of step ``batch``."""
    return [str(_staging(out, batch) / f"{int(p['index']):06d}.log") for p in parts]
