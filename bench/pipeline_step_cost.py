"""The fixed cost of an incremental step: its phases and Spark jobs on a small log.

    .venv/bin/python bench/pipeline_step_cost.py [--events 4000] [--steps 3]

Generates a small cluster's logs (two gateways), feeds them in ``--steps``
equal slices of appended lines to ``--incremental`` steps
(:func:`rabbitflow_pipeline.incremental.run_step`), then analyses the whole
input in one batch run (:func:`rabbitflow_pipeline.batch.analyze`), twice,
in the same local Spark session, built as the job builds its own.  For
each it prints the seconds, the Spark jobs run (the scheduler's job
counter), each phase's seconds, and the seconds and jobs spent keeping
rows (local checkpoints, ``Kept.keep``).  Keeps that run at the same time
(the batch run's steps run in parallel threads) each count the whole time
and every job that ran meanwhile, so there the kept figures overlap and
can exceed the run's own.

On a small log almost none of a step's time is data: it is the cost of
its jobs, so this shows what a step costs whatever its size, and what
the incremental tests pay per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from rabbitflow_pipeline import outputs
from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.generate import generate
from rabbitflow_pipeline.incremental import run_step
from rabbitflow_pipeline.session import build_session


class _KeepMeter:
    """Seconds and Spark jobs spent in ``Kept.keep`` (local checkpoints)."""

    def __init__(self, jobs: Callable[[], int]) -> None:
        self.seconds, self.jobs, self._jobs = 0.0, 0, jobs
        original = outputs.Kept.keep

        def keep(kept: outputs.Kept, df: DataFrame) -> DataFrame:
            started, first = time.perf_counter(), jobs()
            try:
                return original(kept, df)
            finally:
                self.seconds += time.perf_counter() - started
                self.jobs += jobs() - first

        outputs.Kept.keep = keep  # type: ignore[method-assign,assignment]

    def take(self) -> tuple[float, int]:
        taken = (self.seconds, self.jobs)
        self.seconds, self.jobs = 0.0, 0
        return taken


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=4000, help="events per gateway log")
    parser.add_argument("--steps", type=int, default=3, help="incremental steps")
    args = parser.parse_args(argv)

    spark = build_session("local[2]", "rabbitflow-step-cost")  # the job's own settings
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()

    def jobs() -> int:
        return int(scheduler.nextJobId())

    meter = _KeepMeter(jobs)
    work = Path(tempfile.mkdtemp(prefix="rf-step-cost-"))
    source = work / "gen"
    source.mkdir()
    logs = generate(source, events=args.events, queues=10, days=0.2, gateways=2, processes=1)
    lines = [path.read_text().splitlines() for path in logs]
    live = work / "live"
    live.mkdir()
    paths = [str(live / "*.jsonl")]

    def report(label: str, run: Callable[[], Any]) -> None:
        started, first = time.perf_counter(), jobs()
        result = run()
        seconds, ran = time.perf_counter() - started, jobs() - first
        keep_s, keep_jobs = meter.take()
        phases = ", ".join(f"{k} {v:.2f}" for k, v in getattr(result, "phases", {}).items())
        print(
            f"{label:<14} {seconds:6.1f} s  {ran:3d} jobs  "
            f"kept {keep_s:5.2f} s in {keep_jobs:2d} jobs  phases: {phases}",
            flush=True,
        )

    for step in range(args.steps):
        for index, log in enumerate(lines):
            start, end = len(log) * step // args.steps, len(log) * (step + 1) // args.steps
            with open(live / f"gw{index}.jsonl", "a", encoding="utf-8") as handle:
                handle.write("".join(f"{line}\n" for line in log[start:end]))
        report(f"step {step}", lambda: run_step(spark, paths, work / "incremental"))
    report("batch", lambda: analyze(spark, paths, work / "batch"))
    report("batch again", lambda: analyze(spark, paths, work / "batch2"))
    spark.stop()


if __name__ == "__main__":
    main()
