"""``report.html``: one self-contained page with inline SVG charts and tables.

Pure Python over small, already-aggregated rows (the job collects them);
no JavaScript, no external CSS or fonts, so it renders offline.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReportData", "bar_chart_svg", "histogram_svg", "render_report", "timeline_svg"]

Row = Mapping[str, Any]

_PALETTE = ("#c0392b", "#2471a3", "#1e8449", "#b9770e", "#7d3c98")


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, already aggregated."""

    inputs: Sequence[str]
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    totals: Mapping[str, int]
    summary: Sequence[Row]
    timeline: Sequence[Row]  # vhost, queue, bucket, overfull_s, bucket_s
    timeline_buckets: int
    timeline_queues: Sequence[Row]  # vhost, queue of the drawn lines, top first
    block_histogram: Sequence[Row]  # bucket, lower_s, upper_s, count
    delay_histogram: Sequence[Row]
    advice: Sequence[Row]
    malformed: Sequence[Row]
    store_episodes: Sequence[Row] = field(default_factory=tuple)
    send_delays: Sequence[Row] = field(default_factory=tuple)
    #: The episodes and blocks open right now, shown first (a live report); None: no section.
    open_now: Sequence[Row] | None = None


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _fmt(value: object) -> str:
    if value is None:
        return "\u2013"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _label(row: Row) -> str:
    vhost = str(row.get("vhost") or "/")
    return str(row["queue"]) if vhost == "/" else f"{vhost}:{row['queue']}"


#: Characters of a queue label that fit left of a chart (11 px text in 214 px).
_LABEL_CHARS = 32


def _short(label: str) -> str:
    """``label`` cut to what fits left of a chart, with an ellipsis when cut."""
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "\u2026"


def _label_text(x: float, y: float, label: str) -> str:
    """A right-aligned chart label; a cut label keeps its full text as a tooltip."""
    return (
        f"<text x='{x}' y='{y}' text-anchor='end' class='lbl'>"
        f"<title>{_e(label)}</title>{_e(_short(label))}</text>"
    )


def _svg_open(width: int, height: int, label: str) -> str:
    """An SVG that draws at ``width`` px at most and shrinks with the page, never past it."""
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' "
        f"width='100%' style='max-width:{width}px' role='img' aria-label='{label}'>"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def timeline_svg(
    rows: Sequence[Row],
    *,
    queues: Sequence[Row],
    buckets: int,
    window_start: dt.datetime | None,
    window_end: dt.datetime | None,
    width: int = 1300,
) -> str:
    """Heat strips: one line per queue, darker where the queue was overfull longer."""
    drawn = {_label(row) for row in rows}
    labels = [_label(q) for q in queues if _label(q) in drawn]
    if not labels or buckets <= 0:
        return "<p class='empty'>No flow episodes.</p>"
    left, top, line_h = 220, 24, 18
    plot_w = width - left - 20
    height = top + line_h * len(labels) + 40
    cell_w = plot_w / buckets
    parts = [_svg_open(width, height, "episodes over time per queue")]
    for i, label in enumerate(labels):
        y = top + i * line_h
        fill = "#f4f6f7" if i % 2 == 0 else "#ffffff"
        parts.append(f"<rect x='{left}' y='{y}' width='{plot_w}' height='{line_h}' fill='{fill}'/>")
        parts.append(_label_text(left - 6, y + 13, label))
    index = {label: i for i, label in enumerate(labels)}
    for row in rows:
        if _label(row) not in index:
            continue
        frac = min(1.0, float(row["overfull_s"]) / max(float(row["bucket_s"]), 1e-9))
        x = left + int(row["bucket"]) * cell_w
        y = top + index[_label(row)] * line_h + 2
        parts.append(
            f"<rect x='{x:.2f}' y='{y}' width='{max(cell_w, 1.0):.2f}' height='{line_h - 4}' "
            f"fill='#c0392b' fill-opacity='{0.15 + 0.85 * frac:.2f}'>"
            f"<title>{_e(_label(row))}: {float(row['overfull_s']):.0f}s overfull</title></rect>"
        )
    axis_y = top + line_h * len(labels) + 14
    if window_start is not None and window_end is not None:
        span = (window_end - window_start).total_seconds()
        for k in range(6):
            x = left + plot_w * k / 5
            when = window_start + dt.timedelta(seconds=span * k / 5)
            anchor = "start" if k == 0 else ("end" if k == 5 else "middle")
            parts.append(
                f"<line x1='{x:.1f}' y1='{top}' x2='{x:.1f}' y2='{axis_y - 10}' class='grid'/>"
                f"<text x='{x:.1f}' y='{axis_y + 4}' text-anchor='{anchor}' class='lbl'>"
                f"{when:%m-%d %H:%M:%S}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def bar_chart_svg(items: Sequence[tuple[str, float]], *, unit: str = "s", width: int = 1300) -> str:
    """Horizontal bars, one per (label, value), longest first as given."""
    if not items:
        return "<p class='empty'>Nothing to chart.</p>"
    left, top, bar_h = 220, 10, 20
    plot_w = width - left - 140
    top_value = max(v for _, v in items) or 1.0
    height = top + bar_h * len(items) + 10
    parts = [_svg_open(width, height, "bar chart")]
    for i, (label, value) in enumerate(items):
        y = top + i * bar_h
        w = plot_w * value / top_value
        shown = _duration(value) if unit == "s" else f"{value:,.1f}{unit}"
        parts.append(
            _label_text(left - 6, y + 14, label)
            + f"<rect x='{left}' y='{y + 3}' width='{max(w, 1):.1f}' height='{bar_h - 6}' "
            f"fill='{_PALETTE[1]}'/>"
            f"<text x='{left + w + 6:.1f}' y='{y + 14}' class='lbl'>{_e(shown)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram_svg(rows: Sequence[Row], *, color: str = _PALETTE[2], width: int = 640) -> str:
    """Vertical bars per bucket ``[lower_s, upper_s)``, count on top."""
    if not rows or not any(int(r["count"]) for r in rows):
        return "<p class='empty'>No durations recorded.</p>"
    ordered = sorted(rows, key=lambda r: int(r["bucket"]))
    left, top, bottom = 50, 20, 40
    height = 260
    plot_h = height - top - bottom
    plot_w = width - left - 10
    bar_w = plot_w / len(ordered)
    peak = max(int(r["count"]) for r in ordered) or 1
    parts = [
        _svg_open(width, height, "histogram"),
        f"<line x1='{left}' y1='{top + plot_h}' x2='{width - 10}' y2='{top + plot_h}' "
        f"class='axis'/>",
    ]
    for i, row in enumerate(ordered):
        count = int(row["count"])
        h = plot_h * count / peak
        x = left + i * bar_w
        lower = _duration(float(row["lower_s"]))
        name = (
            f"≥{lower}"
            if row["upper_s"] is None
            else f"{lower}\u2013{_duration(float(row['upper_s']))}"
        )
        parts.append(
            f"<rect x='{x + 2:.1f}' y='{top + plot_h - h:.1f}' width='{bar_w - 4:.1f}' "
            f"height='{h:.1f}' fill='{color}'><title>{_e(name)}: {count:,}</title></rect>"
            f"<text x='{x + bar_w / 2:.1f}' y='{top + plot_h - h - 4:.1f}' text-anchor='middle' "
            f"class='lbl'>{count:,}</text>"
            f"<text x='{x + bar_w / 2:.1f}' y='{top + plot_h + 16}' text-anchor='middle' "
            f"class='lbl'>{_e(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: Sequence[Row], columns: Sequence[str], *, empty: str) -> str:
    if not rows:
        return f"<p class='empty'>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return (
        f"<div class='table'><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1c2833;
overflow-wrap:anywhere}svg{display:block;height:auto}
.table{max-width:100%;overflow-x:auto}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d5d8dc}
.meta{color:#566573;font-size:13px}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{background:#f4f6f7;border-radius:6px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:22px}.card span{font-size:12px;color:#566573}
table{border-collapse:collapse;font-size:12px;margin:6px 0}th,td{border:1px solid #d5d8dc;
padding:3px 6px;text-align:left;vertical-align:top}th{background:#eaeded}
.lbl{font-size:11px;fill:#1c2833}.grid{stroke:#d5d8dc}.axis{stroke:#566573}
.empty{color:#808b96;font-style:italic}.row{display:flex;gap:24px;flex-wrap:wrap}
.row>div{flex:1 1 560px;min-width:0;max-width:640px}
"""


def _open_now(rows: Sequence[Row] | None) -> list[str]:
    """The live report's first section: what is open now, oldest first."""
    if rows is None:
        return []
    return [
        "<h2>Open now</h2>",
        _table(
            rows,
            ["kind", "vhost", "queue", "connection", "channel", "start"],
            empty="Nothing is open: no queue overfull, no channel blocked, no store overfull.",
        ),
    ]


def render_report(data: ReportData) -> str:
    """The complete HTML page."""
    window = "no events"
    if data.window_start is not None and data.window_end is not None:
        span = (data.window_end - data.window_start).total_seconds()
        window = f"{_fmt(data.window_start)} → {_fmt(data.window_end)} UTC ({_duration(span)})"
    cards = "".join(
        f"<div class='card'><b>{_e(_fmt(v))}</b><span>{_e(k)}</span></div>"
        for k, v in data.totals.items()
    )
    bars = [
        (_label(r), float(r["time_overfull_s"]))
        for r in data.summary
        if float(r.get("time_overfull_s") or 0) > 0
    ][:30]
    summary_cols = [
        "vhost",
        "queue",
        "flow_stopped_count",
        "time_overfull_s",
        "pct_time_overfull",
        "open_episodes",
        "duration_p50_s",
        "duration_p95_s",
        "duration_max_s",
        "channels_blocked",
    ]
    advice_cols = ["vhost", "queue", "episodes", "stop_ok", "stop_advice", "resume_advice"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>rabbitflow flow-control report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>rabbitflow flow-control report</h1>",
        f"<div class='meta'>Window: {_e(window)}<br>Inputs: {_e(', '.join(data.inputs))}</div>",
        f"<div class='cards'>{cards}</div>",
        *_open_now(data.open_now),
        "<h2>Episodes over time per queue</h2>",
        "<div class='meta'>Queues with the most time overfull; darker = overfull for more of "
        "the time slice.</div>",
        timeline_svg(
            data.timeline,
            queues=data.timeline_queues,
            buckets=data.timeline_buckets,
            window_start=data.window_start,
            window_end=data.window_end,
        ),
        "<h2>Time overfull per queue</h2>",
        bar_chart_svg(bars),
        "<h2>Delay distribution</h2><div class='row'><div>",
        "<div class='meta'>Channel blocks (CHN-1005 → 1006/1012), duration</div>",
        histogram_svg(data.block_histogram),
        "</div><div><div class='meta'>Client send delays (longest wait per delayed send "
        "notice)</div>",
        histogram_svg(data.delay_histogram, color=_PALETTE[3]),
        "</div></div>",
        "<h2>Threshold advice</h2>",
        _table(data.advice, advice_cols, empty="No queue had a flow episode."),
        "<h2>Queue summary</h2>",
        _table(data.summary, summary_cols, empty="No queue had a flow episode."),
        "<h2>Store episodes</h2>",
        _table(
            data.store_episodes,
            ["vhost", "start", "end", "duration_s", "open", "start_size", "overfull_size"],
            empty="No store episodes.",
        ),
        "<h2>Send delays (client logs)</h2>",
        _table(
            data.send_delays,
            [
                "producer",
                "destination",
                "longest_delay_ms",
                "delayed_notices",
                "timeouts",
                "capacity",
            ],
            empty="No client flow records.",
        ),
        "<h2>Malformed lines</h2>",
        _table(data.malformed, ["log", "source", "reason", "count"], empty="None."),
        "</body></html>",
    ]
    return "\n".join(parts)
