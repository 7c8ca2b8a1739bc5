"""``--incremental``: steps over a growing input end in the batch job's tables, exactly."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rabbitflow_broker.events import Event
from rabbitflow_pipeline import settling
from rabbitflow_pipeline.batch import analyze
from rabbitflow_pipeline.generate import generate
from rabbitflow_pipeline.incremental import (
    STATE_DIR,
    StepResult,
    follow,
    load_checkpoint,
    run_step,
)

from .jvm import compiled_classes
from .logs import at, enforced, line, over, removed, under
from .tables import assert_same_tables

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

#: A Broker-J operational log (text lines), read by content beside the JSON logs.
BROKER_J = [
    "2026-11-18 11:07:00,000 INFO  [IO-/127.0.0.1:40029] (q.m.q.overfull) - MESSAGE "
    "[vh(/bj)/qu(legacy)] [vh(/bj)/qu(legacy)] QUE-1003 : Overfull : Size : 1,200 bytes, "
    "Capacity : 1,000",
    "2026-11-18 11:07:05,000 INFO  [IO-/127.0.0.1:40029] (c.m.c.open) - MESSAGE "
    "[con:7(guest@/127.0.0.1:50514/bj)] CON-1001 : Open",
    "this line is not an event",
    "2026-11-18 11:09:00,000 INFO  [IO-/127.0.0.1:40029] (q.m.q.underfull) - MESSAGE "
    "[vh(/bj)/qu(legacy)] [vh(/bj)/qu(legacy)] QUE-1004 : Underfull : Size : 600 bytes, "
    "Resume Capacity : 800",
]


class Crash(Exception):
    """Stands for the process being killed at a stage of a step."""


def crash_at(stage: str):  # type: ignore[no-untyped-def]
    def hook(name: str) -> None:
        if name == stage:
            raise Crash(stage)

    return hook


def mid_episode_cut(lines: list[str]) -> int:
    """A line index two past a QUE-1003 whose episode is still open at the next line."""
    records = [json.loads(text) for text in lines]
    for index in range(len(lines) // 3, len(lines) - 2):
        if records[index]["code"] == "QUE-1003" and records[index + 1]["code"] != "QUE-1004":
            return index + 2
    raise AssertionError("no queue episode in the generated log")


def tree(out: Path) -> dict[str, str]:
    """Every file under ``out`` with a digest of its content."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[str]], list[str]]:
    """Two gateway logs and the client logs, as lists of lines."""
    src = tmp_path_factory.mktemp("gen")
    gateways = generate(
        src, events=4000, queues=10, days=0.2, gateways=2, processes=1, client_fraction=0.5
    )
    client_lines = [
        text
        for path in sorted(src.glob("client-*.jsonl"))
        for text in path.read_text().splitlines()
    ]
    return [p.read_text().splitlines() for p in gateways], client_lines


def append(path: Path, lines: list[str], *, partial: str = "") -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(f"{text}\n" for text in lines) + partial)


def test_incremental_steps_end_in_the_batch_tables(
    spark: SparkSession,
    tmp_path: Path,
    generated: tuple[list[list[str]], list[str]],
) -> None:
    (gw0, gw1), client = generated
    live = tmp_path / "live"
    live.mkdir()
    out = tmp_path / "incremental"
    events = [str(live / "*.jsonl"), str(live / "*.log")]
    clients = [str(live / "client.json")]
    cut = mid_episode_cut(gw0)
    half = len(gw1) // 2

    def step(**kwargs: object) -> None:
        run_step(spark, events, out, client_paths=clients, **kwargs)  # type: ignore[arg-type]

    # Step 0: the first part of one gateway's log, ending inside an episode
    # (its QUE-1003 is read, its QUE-1004 is not), and a line cut in two
    # (its end arrives with the next step).
    head = gw0[:cut]
    append(live / "gw0.jsonl", head[:-1], partial=head[-1][:17])
    append(live / "client.json", client[: len(client) // 2])
    step()
    first = load_checkpoint(out)
    assert first.batch == 0
    # The open episode is stored as state, not yet a closed row.
    open_rows = spark.read.parquet(str(out / "episodes")).where("open").count()
    assert open_rows >= 1

    # Step 1: the rest of the cut line and more appended lines; a new file of
    # the second gateway and a Broker-J log.
    append(live / "gw0.jsonl", [head[-1][17:], *gw0[cut : cut + 400]])
    append(live / "gw1.jsonl", gw1[:half])
    append(live / "broker.log", BROKER_J[:2])
    step()

    # Step 2, killed once after every table was written but before the
    # commit, then run again: the rest of everything.
    append(live / "gw0.jsonl", gw0[cut + 400 :])
    append(live / "gw1.jsonl", gw1[half:])
    append(live / "broker.log", BROKER_J[2:])
    append(live / "client.json", client[len(client) // 2 :])
    with pytest.raises(Crash):
        step(hook=crash_at("tables"))
    step()
    assert load_checkpoint(out).batch == 2

    # A run with nothing new changes nothing.
    before = tree(out)
    step()
    assert tree(out) == before
    assert load_checkpoint(out).batch == 2

    batch = tmp_path / "batch"
    analyze(spark, events, batch, client_paths=clients)
    assert_same_tables(out, batch)
    # Every input line was counted exactly once.
    totals = load_checkpoint(out)
    assert totals.lines == len(gw0) + len(gw1) + len(BROKER_J)
    assert totals.malformed == 1
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert not list((out / STATE_DIR / "staging").iterdir())


def test_follow_shows_appended_lines_within_two_triggers(
    spark: SparkSession, tmp_path: Path
) -> None:
    live = tmp_path / "events.jsonl"
    out = tmp_path / "out"
    live.write_text(line(over(0, "orders")) + "\n")
    steps: list[StepResult] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=follow,
        args=(spark, [str(live)], out),
        kwargs={"trigger_s": 0.5, "stop": stop, "on_step": steps.append, "lateness_s": 0},
    )
    runner.start()
    try:
        wait_for(lambda: any(s.changed for s in steps), "the first step")
        report = (out / "report.html").read_text()
        assert "<h2>Open now</h2>" in report.split("<h2>Episodes over time")[0]
        appended_after = len(steps)
        append(live, [line(under(20, "orders")), line(over(30, "orders"))])

        def closed_episode_shown() -> bool:
            try:
                rows = spark.read.parquet(str(out / "episodes")).orderBy("start").collect()
            except Exception:  # a step replaced a file while this read listed the table
                return False
            return [r["open"] for r in rows] == [False, True]

        wait_for(closed_episode_shown, "the appended lines in the episodes table")
        # A step reports itself after writing its tables: wait for its report.
        wait_for(
            lambda: any(step.changed for step in steps[appended_after:]),
            "the step that read the appended lines to report",
        )
        # The step that started before the append may have missed it; the next one may not.
        # (Steps with nothing new may finish while this test reads the table: not counted.)
        after = steps[appended_after:]
        first_changed = next(i for i, step in enumerate(after) if step.changed)
        assert first_changed <= 1, [step.changed for step in after]
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert load_checkpoint(out).lines == 3


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def member_line(event: Event, gateway: str) -> str:
    """A record as a member of a gateway cluster logs it (with its ``gateway`` field)."""
    return json.dumps({**event.to_record(), "gateway": gateway})


def test_channel_blocks_across_a_rotation_are_one_row_each(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The gateway rotates its event log between two steps: one block's close
    # is appended before the rename (read from events.jsonl.1), the other's
    # is logged to the new events.jsonl.
    live = tmp_path / "live"
    live.mkdir()
    out = tmp_path / "incremental"
    log = live / "events.jsonl"
    inputs = [str(live / "events.jsonl*")]
    append(log, [line(over(0, "orders")), line(enforced(1, 7, 1, "orders"))])
    append(log, [line(enforced(2, 7, 2, "orders"))])
    run_step(spark, inputs, out)
    append(log, [line(removed(20, 7, 1))])
    os.rename(log, live / "events.jsonl.1")
    append(log, [line(removed(21, 7, 2)), line(under(22, "orders"))])
    run_step(spark, inputs, out)

    blocks = spark.read.parquet(str(out / "channel_blocks")).orderBy("channel").collect()
    assert [(b["channel"], b["closed_by"], b["source"]) for b in blocks] == [
        (1, "CHN-1006", log.as_uri()),
        (2, "CHN-1006", log.as_uri()),
    ]
    batch = tmp_path / "batch"
    analyze(spark, inputs, batch)
    assert_same_tables(out, batch)


def test_two_members_logging_one_transition_make_one_episode(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Both members of a gateway cluster log each transition of the shared
    # queue; the second member's file is read one step later than the first's.
    live = tmp_path / "live"
    live.mkdir()
    out = tmp_path / "incremental"
    inputs = [str(live / "*.jsonl")]

    def transitions(member: str, lag: float) -> list[str]:
        return [
            member_line(over(0 + lag, "orders"), member),
            member_line(under(20 + lag, "orders"), member),
            member_line(over(40 + lag, "orders"), member),
        ]

    append(live / "gw-a.jsonl", transitions("a", 0))
    run_step(spark, inputs, out)
    append(live / "gw-b.jsonl", transitions("b", 0.5))
    run_step(spark, inputs, out)
    # Later transitions of both settle the first ones into the stored state.
    append(live / "gw-a.jsonl", [member_line(under(200, "orders"), "a")])
    append(live / "gw-b.jsonl", [member_line(under(200.5, "orders"), "b")])
    run_step(spark, inputs, out)

    episodes = spark.read.parquet(str(out / "episodes")).orderBy("start").collect()
    utc = [
        (at(t0).replace(tzinfo=None), at(t1).replace(tzinfo=None))
        for t0, t1 in ((0, 20), (40, 200))
    ]
    assert [(r["start"], r["end"]) for r in episodes] == utc
    batch = tmp_path / "batch"
    analyze(spark, inputs, batch)
    assert_same_tables(out, batch)


def test_a_duplicate_transition_read_steps_later_is_dropped(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Member a logs a short episode; member b's copy of it is read two steps
    # later, after a's episode was settled into the stored tables.
    live = tmp_path / "live"
    live.mkdir()
    out = tmp_path / "incremental"
    inputs = [str(live / "*.jsonl")]
    append(
        live / "gw-a.jsonl",
        [member_line(over(0, "orders"), "a"), member_line(under(0.3, "orders"), "a")],
    )
    run_step(spark, inputs, out, lateness_s=0)
    append(live / "gw-a.jsonl", [member_line(over(100, "other"), "a")])
    run_step(spark, inputs, out, lateness_s=0)
    append(
        live / "gw-b.jsonl",
        [member_line(over(0.5, "orders"), "b"), member_line(under(0.8, "orders"), "b")],
    )
    run_step(spark, inputs, out, lateness_s=0)
    rows = spark.read.parquet(str(out / "episodes")).where("queue = 'orders'").collect()
    assert [(r["start"], r["end"]) for r in rows] == [
        (at(0).replace(tzinfo=None), at(0.3).replace(tzinfo=None))
    ]
    batch = tmp_path / "batch"
    analyze(spark, inputs, batch)
    assert_same_tables(out, batch)


@dataclass(frozen=True)
class QuarterSteps:
    """One gateway's log read in four steps, as three tests below look at it."""

    out: Path
    #: The batch job's tables for the same log.
    batch: Path
    #: Classes Spark compiled during each step.
    compiled: list[int]
    #: The statistics the third step named, and whether they were on disk then.
    rebuilt_stats: str | None
    rebuilt_on_disk: bool


@pytest.fixture(scope="module")
def quarter_steps(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    generated: tuple[list[list[str]], list[str]],
) -> QuarterSteps:
    """``gw0`` appended a quarter at a time, a step after each quarter (no lateness).

    Settled files are compacted past two per table (so the third step
    compacts); after the second step the checkpoint is made one from before
    the per-queue statistics were kept (none named, none on disk); Spark's
    compilation counter is read around each step.  One scenario for three
    tests: each step costs seconds of Spark jobs.
    """
    (gw0, _gw1), _client = generated
    tmp = tmp_path_factory.mktemp("quarters")
    live = tmp / "gw0.jsonl"
    out = tmp / "incremental"
    compiled: list[int] = []
    rebuilt: tuple[str | None, bool] = (None, False)
    quarter = len(gw0) // 4
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settling, "_COMPACT_AFTER", 2)
        for index in range(4):
            append(live, gw0[index * quarter : (index + 1) * quarter if index < 3 else None])
            before = compiled_classes(spark)
            run_step(spark, [str(live)], out, lateness_s=0)
            compiled.append(compiled_classes(spark) - before)
            if index == 1:
                _forget_stats(out)
            if index == 2:
                stats = load_checkpoint(out).stats
                rebuilt = (stats, stats is not None and (out / STATE_DIR / stats).is_dir())
    batch = tmp / "batch"
    analyze(spark, [str(live)], batch)
    return QuarterSteps(out, batch, compiled, *rebuilt)


def _forget_stats(out: Path) -> None:
    """Make the checkpoint one written before the per-queue statistics were kept."""
    commit_file = out / STATE_DIR / "commit.json"
    doc = json.loads(commit_file.read_text())
    assert doc["stats"] is not None
    del doc["stats"]
    commit_file.write_text(json.dumps(doc))
    shutil.rmtree(out / STATE_DIR / "stats")


def test_settled_step_files_are_compacted_and_the_tables_stay_those_of_the_batch_job(
    quarter_steps: QuarterSteps,
) -> None:
    """Past ``_COMPACT_AFTER`` settled files a table's are rewritten into one;
    the checkpoint names the compacted file and the originals are gone."""
    out = quarter_steps.out
    tables = load_checkpoint(out).tables
    compacted = [f for f in tables["episodes"] if "c-" in f]
    assert compacted, tables["episodes"]
    settled = [f for f in tables["episodes"] if f.startswith("b") and "c-" not in f]
    assert len(settled) <= 2, tables["episodes"]
    for table in ("episodes", "channel_blocks", "store_episodes"):
        on_disk = {p.name for p in (out / table).glob("*.parquet")}
        assert on_disk == set(tables[table]), (table, on_disk, tables[table])
    assert_same_tables(out, quarter_steps.batch)


def test_a_checkpoint_without_stored_statistics_starts_them_from_its_episodes(
    quarter_steps: QuarterSteps,
) -> None:
    """A checkpoint written before the per-queue statistics were kept (none named,
    none on disk): the next step builds them from the stored episodes once, and
    the summary and advice are still the batch job's."""
    assert quarter_steps.rebuilt_stats is not None
    assert quarter_steps.rebuilt_on_disk
    stats = load_checkpoint(quarter_steps.out).stats
    assert stats is not None
    assert (quarter_steps.out / STATE_DIR / stats).is_dir()
    assert_same_tables(quarter_steps.out, quarter_steps.batch)


def test_a_warm_step_compiles_no_new_code(spark: SparkSession, quarter_steps: QuarterSteps) -> None:
    """Steps over more of the same input run the code the earlier steps generated.

    A value new at each step (the frontier, the observed window) folded into
    a query as a literal would make Spark generate and compile new classes
    at every step, then run them cold until the JVM's JIT compiles them
    again: counted here, not timed, by Spark's own compilation counter.
    """
    # The last step runs the code the earlier ones generated (in a JVM that
    # ran other tests first, the first step may already find all of it).
    assert quarter_steps.compiled[-1] == 0, quarter_steps.compiled
    # The counter counts: a literal new to this JVM is new code.
    before = compiled_classes(spark)
    fresh = time.time_ns()
    assert spark.range(3).select((F.col("id") + F.lit(fresh)).alias("v")).collect()
    assert compiled_classes(spark) > before
