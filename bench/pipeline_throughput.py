"""Throughput of the full rabbitflow-analyze job against a bare Spark JSON read.

    .venv/bin/python bench/pipeline_throughput.py [--events 5000000] [--dir /tmp/rf-bench]

Generates the event logs once (reused when the directory already holds the
same count), then in one Spark session times, side by side:

* baseline: ``spark.read.json(files).count()`` on the same files;
* analysis: every table of ``rabbitflow-analyze`` and ``report.html``
  (:func:`rabbitflow_pipeline.cli.analyze`).

Prints both and the ratio (target: analysis <= 2.5x baseline).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rabbitflow_pipeline.cli import analyze, build_session
from rabbitflow_pipeline.generate import generate

TARGET_RATIO = 2.5


def _logs(root: Path, events: int, queues: int, days: float) -> tuple[list[str], list[str]]:
    data = root / f"events-{events}"
    marker = data / "COMPLETE"
    if not marker.exists():
        shutil.rmtree(data, ignore_errors=True)
        started = time.monotonic()
        generate(data, events=events, queues=queues, days=days)
        marker.write_text(f"{events}\n")
        print(f"generated {events:,} events in {time.monotonic() - started:.1f}s -> {data}")
    else:
        print(f"reusing {events:,} events in {data}")
    gateway = sorted(str(p) for p in data.glob("gateway-*.jsonl"))
    client = sorted(str(p) for p in data.glob("client-*.jsonl"))
    return gateway, client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--queues", type=int, default=300)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "rf-bench")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    gateway, client = _logs(args.dir, args.events, args.queues, args.days)
    size = sum(Path(p).stat().st_size for p in gateway + client)
    spark = build_session(args.master, "rabbitflow-bench")
    try:
        # Warm the JVM (class loading, JIT of the JSON parser) for both sides alike.
        spark.read.json(gateway[:1]).limit(1000).count()

        started = time.monotonic()
        rows = spark.read.json(gateway + client).count()
        baseline = time.monotonic() - started

        out = args.dir / "out"
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        result = analyze(spark, gateway, out, client_paths=client)
        analysis = time.monotonic() - started
    finally:
        spark.stop()

    ratio = analysis / baseline
    print(
        f"input: {len(gateway)} gateway logs + {len(client)} client logs, {size / 2**20:,.0f} MiB, "
        f"{rows:,} lines; master {args.master}"
    )
    print(f"baseline spark.read.json(files).count(): {baseline:8.1f}s")
    print(
        f"analysis (all tables + report.html):      {analysis:8.1f}s "
        f"({result.events:,} events, {result.episodes:,} episodes)"
    )
    for name, seconds in result.phases.items():
        print(f"  {name:<28} {seconds:6.1f}s")
    print(
        f"ratio analysis/baseline: {ratio:.2f}x (target <= {TARGET_RATIO}x) "
        f"{'OK' if ratio <= TARGET_RATIO else 'OVER TARGET'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
