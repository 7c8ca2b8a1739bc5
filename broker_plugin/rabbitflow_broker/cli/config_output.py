"""What ``rabbitflow-config`` prints (:mod:`rabbitflow_broker.cli.config_cli`).

The text forms of the admin API's answers: the ``queues`` table and the
``queue NAME`` details (``--json`` prints the answers as they are).  Pure:
mappings in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_count", "format_queue", "format_queues"]


def format_count(value: object) -> str:
    """An integer with thousands separators (``1,234``); anything else as ``str``."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _pair(queue: Mapping[str, Any], stop: str, resume: str) -> str:
    return f"{format_count(queue.get(stop, 0))}/{format_count(queue.get(resume, 0))}"


def _blocked(queue: Mapping[str, Any]) -> list[str]:
    return [
        f"con:{c.get('connection')}/ch:{c.get('channel')}"
        for c in queue.get("blockedChannels") or []
        if isinstance(c, Mapping)
    ]


def format_queues(queues: Sequence[Mapping[str, Any]]) -> str:
    """The ``queues`` table."""
    header = (
        "vhost",
        "queue",
        "msgs",
        "bytes",
        "stop/resume count",
        "stop/resume size",
        "flowStopped",
        "flowStoppedCount",
        "blocked",
    )
    rows = [header]
    for q in queues:
        rows.append(
            (
                str(q.get("vhost", "")),
                str(q.get("name", "")),
                format_count(q.get("messages", 0)),
                format_count(q.get("bytes", 0)),
                _pair(q, "flowStopCount", "flowResumeCount"),
                _pair(q, "flowStopSize", "flowResumeSize"),
                "Y" if q.get("flowStopped") else "N",
                format_count(q.get("flowStoppedCount", 0)),
                str(len(q.get("blockedChannels") or [])),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("=" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def format_queue(q: Mapping[str, Any]) -> str:
    """The ``queue NAME`` details."""
    fields = [
        ("name", q.get("name")),
        ("vhost", q.get("vhost")),
        ("messages", format_count(q.get("messages", 0))),
        ("bytes", format_count(q.get("bytes", 0))),
        ("flowStopCount", format_count(q.get("flowStopCount", 0))),
        ("flowResumeCount", format_count(q.get("flowResumeCount", 0))),
        ("flowStopSize", format_count(q.get("flowStopSize", 0))),
        ("flowResumeSize", format_count(q.get("flowResumeSize", 0))),
        ("thresholdsSource", q.get("source", "?")),
        ("flowStopped", q.get("flowStopped")),
        ("flowStoppedCount", format_count(q.get("flowStoppedCount", 0))),
        ("blockedChannels", ", ".join(_blocked(q)) or "none"),
    ]
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)
