"""Per-file read offsets of the incremental job: what is new in each input since the last run.

Spark's file source sees new files only, never lines appended to a file it
has read; the gateway appends to one event log.  So the job tracks, for
every input file, how many bytes it has consumed, and reads on from there.

A file is known by its identity (device and inode) and the digest of its
first consumed bytes, not by its name:

* lines appended to a known file are read from the offset on;
* a rotated file (renamed, e.g. ``events.jsonl`` to ``events.jsonl.1``)
  is the same file under a new name: what was appended before the rename
  is read, nothing twice; the new ``events.jsonl`` is a new file, read
  from its start;
* a file that is now shorter than its offset, or whose first bytes
  changed (truncated and rewritten, or its inode reused), starts over;
* only whole lines are consumed: a last line without its newline yet is
  left for the next run.

:func:`plan_reads` is pure (observations in, reads out); :func:`observe`
and :func:`copy_range` are the file I/O around it.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPRESSED_SUFFIXES",
    "HEAD_BYTES",
    "FileRead",
    "InputChanged",
    "Observed",
    "Tracked",
    "copy_range",
    "observe",
    "plan_reads",
]

_log = logging.getLogger(__name__)

#: Names of compressed files, which a step does not read (see :func:`observe`).
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".snappy", ".deflate")
#: Compressed files already warned about (see :func:`_files`).
_WARNED: set[str] = set()

#: How many leading bytes of a file identify it beside its inode.
HEAD_BYTES = 1024

_CHUNK = 1 << 16


@dataclass(frozen=True)
class Tracked:
    """A file the job has read: its identity and how far (bytes) it consumed."""

    kind: str  # "events" or "client"
    path: str
    dev: int
    ino: int
    offset: int
    head_len: int
    head_sha: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "head_len": self.head_len,
            "head_sha": self.head_sha,
        }

    @staticmethod
    def from_json(item: Mapping[str, Any]) -> Tracked:
        return Tracked(
            kind=str(item["kind"]),
            path=str(item["path"]),
            dev=int(item["dev"]),
            ino=int(item["ino"]),
            offset=int(item["offset"]),
            head_len=int(item["head_len"]),
            head_sha=str(item["head_sha"]),
        )


@dataclass(frozen=True)
class Observed:
    """An input file as it is now.

    ``complete`` is the size up to and including its last newline (the
    bytes that are whole lines); ``heads`` maps each tracked ``head_len``
    of this identity to the digest of that many leading bytes now.
    """

    kind: str
    path: str
    dev: int
    ino: int
    complete: int
    heads: Mapping[int, str]


@dataclass(frozen=True)
class FileRead:
    """Bytes ``[start, end)`` of ``path`` to read this run; ``tracked`` is the file afterwards."""

    kind: str
    path: str
    start: int
    end: int
    tracked: Tracked


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _complete_size(fd: int, size: int) -> int:
    """The offset just past the last newline of the first ``size`` bytes (0 when none)."""
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        chunk = os.pread(fd, end - start, start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def observe(patterns: Iterable[tuple[str, str]], tracked: Sequence[Tracked] = ()) -> list[Observed]:
    """Stat every file matching ``(kind, pattern)`` patterns, in path order, each once.

    A pattern is a glob, a file or a directory (its files, but those whose
    names start with ``.`` or ``_``, as Spark reads a directory).  A glob
    that matches nothing contributes nothing (its files may come later).
    A file seen under two names (a rename while the patterns are walked, or
    a hard link) is taken once, under the first.

    Raises:
        FileNotFoundError: a pattern that is not a glob names nothing that
            exists, and no file has been read yet (``tracked`` is empty): a
            mistyped path fails the first step, as it fails a batch run, where
            later a missing file is one rotated away and not yet started again.
    """
    head_lens: dict[tuple[int, int], set[int]] = {}
    for item in tracked:
        head_lens.setdefault((item.dev, item.ino), set()).add(item.head_len)
    seen: set[str] = set()
    identities: set[tuple[int, int]] = set()
    found: list[Observed] = []
    for kind, pattern in patterns:
        for path in _files(pattern, required=not tracked):
            if path in seen:
                continue
            seen.add(path)
            seen_now = _observe_file(kind, path, head_lens)
            if seen_now is None or (seen_now.dev, seen_now.ino) in identities:
                continue
            identities.add((seen_now.dev, seen_now.ino))
            found.append(seen_now)
    return found


def _files(pattern: str, *, required: bool) -> list[str]:
    """The resolved paths of the files ``pattern`` names now (see :func:`observe`)."""
    if glob.has_magic(pattern):
        names = sorted(glob.glob(pattern))
    elif os.path.exists(pattern):
        names = [pattern]
    elif required:
        raise FileNotFoundError(f"{pattern}: no such file or directory")
    else:
        names = []
    files: list[str] = []
    for name in names:
        if os.path.isdir(name):
            inside = sorted(n for n in os.listdir(name) if not n.startswith((".", "_")))
            files.extend(str(Path(name, n).resolve()) for n in inside)
        else:
            files.append(str(Path(name).resolve()))
    kept = [f for f in files if not f.endswith(COMPRESSED_SUFFIXES)]
    for path in set(files).difference(kept, _WARNED):
        # Once per file and process: --follow looks at its inputs every trigger.
        _WARNED.add(path)
        _log.warning(
            "%s: compressed, not read: offsets cannot be kept in it (its lines were read "
            "before it was compressed, if logrotate compresses with delaycompress)",
            path,
        )
    return kept


def _observe_file(
    kind: str, path: str, head_lens: Mapping[tuple[int, int], set[int]]
) -> Observed | None:
    """``path`` as it is now, or None when it is not a regular file (or is gone)."""
    try:
        # Non-blocking, so a FIFO among the inputs cannot hang the step.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, IsADirectoryError):
        return None  # renamed or removed since it was listed: seen under its new name, if any
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        complete = _complete_size(fd, st.st_size)
        wanted = head_lens.get((st.st_dev, st.st_ino), set()) | {min(HEAD_BYTES, complete)}
        heads = {n: _digest(os.pread(fd, n, 0)) for n in wanted if n <= complete}
    finally:
        os.close(fd)
    return Observed(kind, path, st.st_dev, st.st_ino, complete, heads)


def plan_reads(tracked: Sequence[Tracked], observed: Sequence[Observed]) -> list[FileRead]:
    """What to read of each observed file, and every file's tracking afterwards.

    Returns one :class:`FileRead` per observed file (``start == end`` when
    nothing is new); files tracked before but no longer observed are
    dropped from tracking.
    """
    by_identity = {(t.dev, t.ino): t for t in tracked}
    reads: list[FileRead] = []
    for seen in observed:
        known = by_identity.get((seen.dev, seen.ino))
        start = 0
        if (
            known is not None
            and known.kind == seen.kind
            and known.offset <= seen.complete
            and seen.heads.get(known.head_len) == known.head_sha
        ):
            start = known.offset
        end = max(start, seen.complete)
        head_len = min(HEAD_BYTES, end)
        if known is not None and start > 0 and head_len == known.head_len:
            head_sha = known.head_sha
        else:
            head_sha = seen.heads.get(head_len, "")
        reads.append(
            FileRead(
                kind=seen.kind,
                path=seen.path,
                start=start,
                end=end,
                tracked=Tracked(seen.kind, seen.path, seen.dev, seen.ino, end, head_len, head_sha),
            )
        )
    return reads


class InputChanged(OSError):
    """A file changed between being observed and being copied (renamed away,
    replaced or cut short: a rotation under way); observe again."""


def copy_range(source: str, start: int, end: int, target: Path, identity: tuple[int, int]) -> None:
    """Copy bytes ``[start, end)`` of ``source`` into a new file ``target`` (fsynced).

    ``identity`` is the (device, inode) the file had when it was observed.

    Raises:
        InputChanged: ``source`` is now another file, is gone, or is shorter than ``end``.
    """
    try:
        src = open(source, "rb")  # noqa: SIM115 (closed below, with the target)
    except FileNotFoundError as exc:
        raise InputChanged(f"{source} is gone") from exc
    with src, open(target, "wb") as dst:
        st = os.fstat(src.fileno())
        if (st.st_dev, st.st_ino) != identity:
            raise InputChanged(f"{source} is another file than the one observed")
        remaining = end - start
        position = start
        while remaining > 0:
            try:
                done = os.copy_file_range(src.fileno(), dst.fileno(), remaining, position)
            except OSError:
                done = 0
            if done <= 0:
                data = os.pread(src.fileno(), min(remaining, 1 << 20), position)
                if not data:
                    raise InputChanged(f"{source} is shorter than {end} bytes")
                dst.write(data)
                dst.flush()
                done = len(data)
            remaining -= done
            position += done
        os.fsync(dst.fileno())
