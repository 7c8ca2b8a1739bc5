"""Throughput of the full rabbitflow-analyze job against a bare Spark JSON read.

    .venv/bin/python bench/pipeline_throughput.py [--events 5000000] [--dir /tmp/rf-bench]

Generates the event logs once (reused when the directory already holds the
same count), then times, side by side in one JVM:

* baseline: ``spark.read.json(files).count()`` on the same files;
* analysis: every table of ``rabbitflow-analyze`` and ``report.html``
  (:func:`rabbitflow_pipeline.batch.analyze`).

Each round (``--rounds``, default 2) runs the two in turn in a new Spark
session of one Spark application: the first round is the analysis's first
run in the JVM (as a ``spark-submit`` of the job is), later ones run it
warm (as a second run in a notebook or a long-lived service is: the code
Spark generated for it is compiled already).  Prints both
times and the ratio per round (target: analysis <= 2.5x baseline), and each
side's JVM CPU time, in all and by thread group (Spark's tasks, the JIT
compiler, the garbage collector, the rest).

Then (``--incremental-share``, default 5 %) the incremental job: a copy of
the logs cut at 95 % of each file is analysed with ``--incremental``
(timed, as a first step over a long history: a daily job's first run), the
remaining 5 % is appended, and the next incremental step is timed against
the last round's full analysis, with the JVM CPU of each (target: <= 15 %
of a full run).  That step is run ``--step-rounds`` times (default 8), each
from a copy of the checkpoint the first step left: the first is the step's
first run in the JVM after that big one, the later ones run it warm, as
``--follow`` does trigger after trigger.  The JIT goes on compiling what a
step runs for several steps (measured at 5,000,000 events: its CPU falls
from about 12 CPU-s in the first round to 2-3 from the seventh on), so
with four rounds or more the median of the later half (the lower middle
one of an even count) is printed as well: the step ``--follow`` settles
to.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from rabbitflow_pipeline.batch import AnalysisResult, analyze
from rabbitflow_pipeline.generate import generate
from rabbitflow_pipeline.incremental import StepResult, run_step
from rabbitflow_pipeline.session import build_session

TARGET_RATIO = 2.5
FIRST_TARGET_RATIO = 3.0
INCREMENTAL_TARGET = 0.15


#: JVM threads grouped by what they do, from the start of their names
#: (``/proc`` keeps the first 15 characters).
_THREAD_GROUPS = (
    ("tasks", ("Executor task",)),
    ("JIT", ("C1 Compiler", "C2 Compiler")),
    ("GC", ("GC Thread", "G1 ")),
)


@dataclass(frozen=True)
class Side:
    """One side's wall time and the Spark JVM's CPU time meanwhile, in all and by thread group.

    ``by_group`` has ``tasks`` (Spark's task threads: the work itself),
    ``JIT`` (the compiler threads), ``GC`` and ``other``: the rest,
    including the driver and any thread that ended meanwhile.
    """

    seconds: float
    cpu_seconds: float
    by_group: dict[str, float]

    def __str__(self) -> str:
        groups = ", ".join(f"{name} {cpu:.1f}" for name, cpu in self.by_group.items())
        return f"{self.seconds:8.1f}s (JVM CPU {self.cpu_seconds:6.1f}s: {groups})"


def _ticks(stat: str) -> int:
    # Fields 14 and 15 of stat(5) (utime, stime), counted after the ")".
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@dataclass(frozen=True)
class _Cpu:
    total: float
    by_group: dict[str, float]


def _jvm_cpu(spark: SparkSession) -> _Cpu:
    """CPU seconds (user + system) the driver JVM has used so far, in all and per thread group.

    In local mode the executor runs in that JVM too.  Read from Linux's
    ``/proc/<pid>/stat`` and ``/proc/<pid>/task/*/``.
    """
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the Spark session has no JVM")
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    tick = os.sysconf("SC_CLK_TCK")
    groups = dict.fromkeys((name for name, _ in _THREAD_GROUPS), 0.0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ticks = _ticks((task / "stat").read_text())
        except OSError:  # the thread ended while we looked
            continue
        for group, prefixes in _THREAD_GROUPS:
            if name.startswith(prefixes):
                groups[group] += ticks / tick
                break
    return _Cpu(_ticks(Path(f"/proc/{pid}/stat").read_text()) / tick, groups)


def _side(seconds: float, before: _Cpu, after: _Cpu) -> Side:
    total = after.total - before.total
    groups = {name: after.by_group[name] - before.by_group[name] for name in after.by_group}
    groups["other"] = total - sum(groups.values())
    return Side(seconds, total, groups)


def _read_through(paths: list[str]) -> None:
    """Read every file once, so both sides find it in the OS page cache.

    Otherwise the first side to run reads from disk: a round-1 baseline of
    33.6 s wall on 29.4 CPU-s (and a ratio of 1.86x) came from that alone.
    """
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


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
    parser.add_argument(
        "--rounds", type=int, default=2, help="baseline + analysis pairs, run in turn (default 2)"
    )
    parser.add_argument(
        "--step-rounds",
        type=int,
        default=8,
        help="times the incremental step is run, each from the same checkpoint (default 8)",
    )
    parser.add_argument(
        "--incremental-share",
        type=float,
        default=0.05,
        help="share of each log appended before the timed incremental step (0: skip)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.step_rounds < 1:
        parser.error("--step-rounds must be at least 1")

    gateway, client = _logs(args.dir, args.events, args.queues, args.days)
    size = sum(Path(p).stat().st_size for p in gateway + client)
    _read_through(gateway + client)
    rounds: list[tuple[Side, Side, AnalysisResult]] = []
    rows = 0
    out = args.dir / "out"
    application = build_session(args.master, "rabbitflow-bench")
    try:
        for number in range(args.rounds):
            # A new session per round, so no round inherits the SQL state of the
            # one before (analyze drops its kept rows itself).  The application
            # stays, and with it the compiled generated code: Spark caches that
            # per application (its class loader), so a new application would
            # compile about 100 of the run's 150 classes again.
            spark = application if number == 0 else application.newSession()
            # Warm the JSON parser (class loading, JIT) before the baseline.
            spark.read.json(gateway[:1]).limit(1000).count()
            cpu, started = _jvm_cpu(spark), time.monotonic()
            rows = spark.read.json(gateway + client).count()
            baseline = _side(time.monotonic() - started, cpu, _jvm_cpu(spark))
            shutil.rmtree(out, ignore_errors=True)
            cpu, started = _jvm_cpu(spark), time.monotonic()
            result = analyze(spark, gateway, out, client_paths=client)
            analysis = _side(time.monotonic() - started, cpu, _jvm_cpu(spark))
            rounds.append((baseline, analysis, result))
        incremental = None
        if args.incremental_share > 0:
            incremental = _incremental(
                application,
                args.dir,
                gateway,
                client,
                args.incremental_share,
                step_rounds=args.step_rounds,
            )
    finally:
        application.stop()

    print(
        f"input: {len(gateway)} gateway logs + {len(client)} client logs, {size / 2**20:,.0f} MiB, "
        f"{rows:,} lines; master {args.master}"
    )
    for number, (baseline, analysis, result) in enumerate(rounds, 1):
        ratio = analysis.seconds / baseline.seconds
        # Round 1 runs the analysis's own code (sort, window, aggregation,
        # Parquet writer) for the first time in this JVM; later rounds run
        # it warm, as the baseline's JSON reader already is.
        state = (
            "first run of the analysis code in this JVM"
            if number == 1
            else "warm: a new session of the same application"
        )
        print(f"round {number} ({state}):")
        print(f"  baseline spark.read.json(files).count(): {baseline}")
        print(
            f"  analysis (all tables + report.html):      {analysis}\n"
            f"    ({result.events:,} events, {result.episodes:,} episodes)"
        )
        for name, seconds in result.phases.items():
            print(f"    {name:<26} {seconds:6.1f}s")
        print(
            f"  ratio analysis/baseline: {ratio:.2f}x (target <= {TARGET_RATIO}x) "
            f"{'OK' if ratio <= TARGET_RATIO else 'OVER TARGET'}; "
            f"JVM CPU ratio {analysis.cpu_seconds / baseline.cpu_seconds:.2f}x"
            + (f" (first-run target <= {FIRST_TARGET_RATIO}x)" if number == 1 else "")
        )
    if incremental is not None:
        first, steps, appended = incremental
        full = rounds[-1][1]
        print(
            f"first incremental step over {1 - args.incremental_share:.0%} of each log "
            f"(no checkpoint yet): {first}\n"
            f"  ratio to the full analysis (last round): {first.seconds / full.seconds:.2f}x"
        )
        for number, (side, step) in enumerate(steps, 1):
            share = side.seconds / full.seconds
            state = "first after the big step" if number == 1 else "warm"
            print(
                f"incremental step {number} ({state}) over {appended / 2**20:,.1f} MiB appended "
                f"({args.incremental_share:.0%} of each log): {side}\n"
                f"  ratio incremental/full analysis (last round): {share:.1%} "
                f"(target <= {INCREMENTAL_TARGET:.0%}) "
                f"{'OK' if share <= INCREMENTAL_TARGET else 'OVER TARGET'}; "
                f"JVM CPU ratio {side.cpu_seconds / full.cpu_seconds:.1%}"
            )
            for name, seconds in step.phases.items():
                print(f"    {name:<26} {seconds:6.1f}s")
        if len(steps) >= 4:
            # The JIT keeps compiling what a step runs for several steps
            # after the first: the later rounds are what --follow settles to.
            late = sorted(steps[len(steps) // 2 :], key=lambda s: s[0].seconds)
            side = late[(len(late) - 1) // 2][0]  # the lower median
            print(
                f"incremental step, median of rounds {len(steps) // 2 + 1}-{len(steps)}: "
                f"{side.seconds:.1f}s, {side.seconds / full.seconds:.1%} of the full analysis "
                f"(JVM CPU {side.cpu_seconds / full.cpu_seconds:.1%}; target <= "
                f"{INCREMENTAL_TARGET:.0%})"
            )
    return 0


def _cut(path: str, share: float) -> int:
    """The offset just past the first newline at or after ``share`` of the file."""
    size = Path(path).stat().st_size
    with open(path, "rb") as handle:
        handle.seek(int(size * share))
        handle.readline()
        return handle.tell()


def _incremental(
    spark: SparkSession,
    root: Path,
    gateway: list[str],
    client: list[str],
    share: float,
    *,
    step_rounds: int,
) -> tuple[Side, list[tuple[Side, StepResult]], int]:
    """Time the first step over the first ``1 - share`` of every log, then ``step_rounds``
    steps over the rest, each from the checkpoint the first left (see the module doc)."""
    live = root / "live"
    out = root / "incremental-out"
    saved = root / "incremental-first"
    for directory in (live, out, saved):
        shutil.rmtree(directory, ignore_errors=True)
    live.mkdir(parents=True)
    cuts: dict[str, int] = {}
    for path in gateway + client:
        cuts[path] = _cut(path, 1.0 - share)
        with open(path, "rb") as src, open(live / Path(path).name, "wb") as dst:
            dst.write(src.read(cuts[path]))
    live_gateway = [str(live / Path(p).name) for p in gateway]
    live_client = [str(live / Path(p).name) for p in client]
    cpu, started = _jvm_cpu(spark), time.monotonic()
    run_step(spark, live_gateway, out, client_paths=live_client)
    first = _side(time.monotonic() - started, cpu, _jvm_cpu(spark))
    shutil.copytree(out, saved)
    appended = 0
    for path in gateway + client:
        with open(path, "rb") as src, open(live / Path(path).name, "ab") as dst:
            src.seek(cuts[path])
            rest = src.read()
            appended += len(rest)
            dst.write(rest)
    steps = []
    for _ in range(step_rounds):
        shutil.rmtree(out)
        shutil.copytree(saved, out)
        cpu, started = _jvm_cpu(spark), time.monotonic()
        step = run_step(spark, live_gateway, out, client_paths=live_client)
        steps.append((_side(time.monotonic() - started, cpu, _jvm_cpu(spark)), step))
    return first, steps, appended


if __name__ == "__main__":
    sys.exit(main())
