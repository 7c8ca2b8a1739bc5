"""report.html rendered by headless Chromium; the screenshot is kept as an artifact."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rabbitflow_pipeline.cli import analyze
from rabbitflow_pipeline.generate import generate

pytestmark = [pytest.mark.browser, pytest.mark.spark]

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "pipeline-report.png"


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_report_renders_in_headless_chromium(spark: SparkSession, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (apt-get install -y chromium; scripts/bootstrap)")
    logs = generate(
        tmp_path / "logs",
        events=20_000,
        queues=40,
        days=1,
        gateways=2,
        processes=1,
        client_fraction=0.3,
    )
    client = sorted(str(p) for p in (tmp_path / "logs").glob("client-*.jsonl"))
    out = tmp_path / "out"
    analyze(spark, [str(p) for p in logs], out, client_paths=client)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.unlink(missing_ok=True)
    subprocess.run(
        [
            chromium,
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
            (out / "report.html").as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert ARTIFACT.exists(), "chromium wrote no screenshot"
    assert png_size(ARTIFACT) == (1400, 2000)
    # A blank page compresses to a few KB; charts and tables do not.
    assert ARTIFACT.stat().st_size > 50_000
