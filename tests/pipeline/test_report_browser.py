"""report.html rendered by headless Chromium; the screenshots are kept as artifacts."""

from __future__ import annotations

import asyncio
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from integration.admin._cdp import chromium_page, eventually
from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.generate import generate

from .logs import line, over, under

pytestmark = [pytest.mark.browser, pytest.mark.spark]

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "pipeline-report.png"
NARROW_ARTIFACT = ARTIFACT.with_name("pipeline-report-1200.png")

#: A queue whose name is longer than a chart's label column.
LONG_QUEUE = "settlement.eu-west-1.priority-high.batch-reconciliation-" + "x" * 40


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed (apt-get install -y chromium; scripts/bootstrap)")
    return found


@pytest.fixture(scope="module")
def report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html of generated logs plus one queue with a very long name and long paths."""
    tmp = tmp_path_factory.mktemp("report")
    logs = generate(
        tmp / "logs",
        events=20_000,
        queues=40,
        days=1,
        gateways=2,
        processes=1,
        client_fraction=0.3,
    )
    long_log = tmp / "logs" / ("gateway-with-a-long-file-name-" + "y" * 80 + ".jsonl")
    long_log.write_text(
        "\n".join(
            line(e) for e in (over(0, LONG_QUEUE, vhost="billing"), under(36_000, LONG_QUEUE))
        )
        + "\n"
    )
    client = sorted(str(p) for p in (tmp / "logs").glob("client-*.jsonl"))
    out = tmp / "out"
    analyze(spark, [*(str(p) for p in logs), str(long_log)], out, client_paths=client)
    return out / "report.html"


def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.unlink(missing_ok=True)
    subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium'}",
            f"--screenshot={ARTIFACT}",
            "--window-size=1400,2000",
            report.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert ARTIFACT.exists(), "chromium wrote no screenshot"
    assert png_size(ARTIFACT) == (1400, 2000)
    # A blank page compresses to a few KB; charts and tables do not.
    assert ARTIFACT.stat().st_size > 50_000


#: What sticks out at the page's width: the page itself scrolling sideways,
#: any element past the right edge, and any chart text not inside its chart.
OVERFLOW_PROBE = """(() => {
  const width = document.documentElement.clientWidth;
  const found = [];
  const page = document.documentElement.scrollWidth;
  if (page > width) found.push(`page is ${page}px wide in ${width}px`);
  const name = (el) => `${el.tagName} "${(el.textContent || '').trim().slice(0, 40)}"`;
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width > 0 && (box.right > width + 0.5 || box.left < -0.5)) {
      found.push(`${name(el)} spans ${box.left.toFixed(1)}..${box.right.toFixed(1)}`);
    }
  }
  for (const text of document.querySelectorAll('svg text')) {
    const box = text.getBoundingClientRect();
    const svg = text.ownerSVGElement.getBoundingClientRect();
    if (box.left < svg.left - 0.5 || box.right > svg.right + 0.5) {
      found.push(`${name(text)} cut by its chart (${box.left.toFixed(1)}..${box.right.toFixed(1)}`
        + ` in ${svg.left.toFixed(1)}..${svg.right.toFixed(1)})`);
    }
  }
  return found;
})()"""


async def overflow_at(report: Path, width: int, profile: Path) -> tuple[list[Any], int]:
    async with chromium_page(chromium(), report.as_uri(), profile, width=width) as page:
        # The page is one static document: it is laid out once it has loaded
        # (the report's, not the blank page the browser may still show).
        async def loaded() -> bool:
            return bool(
                await page.evaluate(
                    "document.URL.startsWith('file:') && document.readyState === 'complete'"
                )
            )

        await eventually(loaded, timeout=30, what="report.html to load")
        found = await page.evaluate(OVERFLOW_PROBE)
        bars = await page.evaluate("document.querySelectorAll('svg').length")
        NARROW_ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        await page.screenshot(NARROW_ARTIFACT)
    return list(found), int(bars)


def test_report_fits_1200_px_without_cutting_chart_labels(report: Path, tmp_path: Path) -> None:
    found, charts = asyncio.run(overflow_at(report, 1200, tmp_path / "chromium"))
    assert charts >= 3  # the probe looked at the timeline, the bars and a histogram
    assert found == []
    assert png_size(NARROW_ARTIFACT)[0] == 1200
