"""report.html: self-contained, charts inline, tables escaped."""

from __future__ import annotations

import datetime as dt

from rabbitflow_pipeline.report import ReportData, histogram_svg, render_report

T0 = dt.datetime(2026, 11, 22, 5, 0, 0)


def data(**overrides: object) -> ReportData:
    base: dict[str, object] = {
        "inputs": ["gw.jsonl"],
        "window_start": T0,
        "window_end": T0 + dt.timedelta(hours=1),
        "totals": {"events": 10},
        "summary": [
            {"vhost": "/", "queue": "orders", "time_overfull_s": 60.0, "flow_stopped_count": 2}
        ],
        "timeline": [
            {"vhost": "/", "queue": "orders", "bucket": 3, "overfull_s": 5.0, "bucket_s": 10.0}
        ],
        "timeline_buckets": 10,
        "timeline_queues": [{"vhost": "/", "queue": "orders"}],
        "block_histogram": [{"bucket": 0, "lower_s": 0.0, "upper_s": None, "count": 4}],
        "delay_histogram": [],
        "advice": [{"vhost": "/", "queue": "<orders>", "stop_advice": "OK"}],
        "malformed": [],
    }
    base.update(overrides)
    return ReportData(**base)  # type: ignore[arg-type]


def test_report_has_no_script_or_external_resource() -> None:
    page = render_report(data())
    assert "<script" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page


def test_report_draws_timeline_bars_and_histogram() -> None:
    page = render_report(data())
    assert page.count("<svg") == 3  # timeline, bars, block histogram (no client delays)
    assert "No durations recorded." in page


def test_report_escapes_table_text() -> None:
    assert "&lt;orders&gt;" in render_report(data())


def test_histogram_labels_the_open_last_bucket() -> None:
    svg = histogram_svg(
        [
            {"bucket": 0, "lower_s": 0.0, "upper_s": 5.0, "count": 1},
            {"bucket": 1, "lower_s": 5.0, "upper_s": None, "count": 2},
        ]
    )
    assert "0s\u20135s" in svg
    assert "≥5s" in svg


def test_live_report_starts_with_what_is_open_now() -> None:
    page = render_report(
        data(open_now=[{"kind": "queue", "vhost": "/", "queue": "orders", "start": T0}])
    )
    assert page.index("<h2>Open now</h2>") < page.index("<h2>Episodes over time")
    assert "2026-11-22 05:00:00" in page.split("<h2>Episodes over time")[0]
    assert "Open now" not in render_report(data())
    assert "Nothing is open" in render_report(data(open_now=[]))
