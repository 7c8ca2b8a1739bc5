"""CPU of the event-log parse alone: ``read_events`` + ``classify_events`` to Spark's ``noop`` sink.

    .venv/bin/python bench/pipeline_parse.py [--dir /tmp/rf-bench] [--files 2] [--repeat 3]

Uses the gateway logs :mod:`bench.pipeline_throughput` generated under
``--dir`` (run that first).  In one Spark application, repeated
``--repeat`` times in turn: the bare ``spark.read.json(files).count()`` of
the first ``--files`` gateway logs, then the analysis's parse of the same
files (``classify_events(read_events(...))``, every column written to the
``noop`` sink, as the pairing consumes them).  Prints each side's wall time
and the JVM's CPU (in all and Spark's task threads), and the ratio of task
CPU.  The ``rabbitflow_pipeline`` on ``PYTHONPATH`` is the one measured,
so two source trees are compared by running this once with each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pipeline_throughput import _jvm_cpu, _read_through, _side
from rabbitflow_pipeline import inputs
from rabbitflow_pipeline.inputs import classify_events
from rabbitflow_pipeline.readers import read_events
from rabbitflow_pipeline.session import build_session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rf-bench"))
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    data = args.dir / f"events-{args.events}"
    if not (data / "COMPLETE").exists():
        parser.error(f"no generated logs in {data}: run bench/pipeline_throughput.py first")
    files = sorted(str(p) for p in data.glob("gateway-*.jsonl"))[: args.files]
    _read_through(files)
    print(f"pipeline code: {inputs.__file__}")
    spark = build_session(args.master, "rabbitflow-bench-parse")
    try:
        spark.read.json(files[:1]).limit(1000).count()
        for number in range(1, args.repeat + 1):
            cpu, started = _jvm_cpu(spark), time.monotonic()
            spark.read.json(files).count()
            baseline = _side(time.monotonic() - started, cpu, _jvm_cpu(spark))
            cpu, started = _jvm_cpu(spark), time.monotonic()
            classify_events(read_events(spark, files)).write.format("noop").mode("overwrite").save()
            parse = _side(time.monotonic() - started, cpu, _jvm_cpu(spark))
            ratio = parse.by_group["tasks"] / baseline.by_group["tasks"]
            print(f"repeat {number}:")
            print(f"  baseline read.json().count(): {baseline}")
            print(f"  read_events + classify_events: {parse}")
            print(f"  task CPU ratio parse/baseline: {ratio:.2f}x")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
