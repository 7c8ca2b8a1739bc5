"""The job entry: reads files, writes every table and the report."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from rabbitflow_broker.hub.config import GatewayConfig
from rabbitflow_broker.hub.gateway import Gateway
from rabbitflow_pipeline.batch import TABLES, analyze
from rabbitflow_pipeline.cli import main
from rabbitflow_pipeline.incremental import run_step
from rabbitflow_pipeline.limits import QueueLimitsError, parse_queue_limits

from .jvm import compiled_classes
from .logs import at, client_line, enforced, line, over, removed, store_over, under

pytestmark = pytest.mark.spark


@pytest.fixture
def logs(tmp_path: Path) -> tuple[list[str], list[str]]:
    gw_a = tmp_path / "gw-a.jsonl"
    gw_b = tmp_path / "gw-b.jsonl"
    client = tmp_path / "app.jsonl"
    gw_a.write_text(
        "\n".join(
            [
                line(over(0, "orders")),
                line(enforced(1, 7, 1, "orders")),
                "{broken",
                line(under(20, "orders")),
                line(removed(20, 7, 1)),
                "",
            ]
        )
        + "\n"
    )
    gw_b.write_text("\n".join([line(over(30, "orders")), line(store_over(35))]) + "\n")
    client.write_text(
        "\n".join(
            [client_line(5, "send_delayed", waited_ms=5000, capacity=100), '{"event": "unrelated"}']
        )
        + "\n"
    )
    return [str(tmp_path / "gw-*.jsonl")], [str(client)]


def test_analyze_writes_every_table_and_the_report(
    spark: SparkSession, tmp_path: Path, logs: tuple[list[str], list[str]]
) -> None:
    events, client = logs
    out = tmp_path / "out"
    result = analyze(
        spark, events, out, client_paths=client, queue_limits=[("/", "orders", 1000, None)]
    )
    assert (result.events, result.malformed, result.episodes) == (6, 1, 2)
    assert sorted(p.name for p in out.iterdir()) == sorted([*TABLES, "report.html"])
    assertDataFrameEqual(
        spark.read.parquet(str(out / "episodes")).select("queue", "start", "end", "open"),
        [
            ("orders", at(0).replace(tzinfo=None), at(20).replace(tzinfo=None), False),
            ("orders", at(30).replace(tzinfo=None), None, True),
        ],
    )
    advice = spark.read.parquet(str(out / "advice")).collect()
    assert advice[0]["stop_advice"].startswith("OK: stop 900 + producer capacities 100")
    report = (out / "report.html").read_text()
    assert "<svg" in report
    assert "orders" in report
    assert "<script" not in report


def test_analyze_without_client_logs_writes_empty_client_tables(
    spark: SparkSession, tmp_path: Path, logs: tuple[list[str], list[str]]
) -> None:
    events, _client = logs
    out = tmp_path / "out"
    # Adaptive execution (on in the job and in the test session) is what
    # replaced the plan of the empty client log together with its observed
    # metrics.
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    result = analyze(spark, events, out)
    assert (result.events, result.malformed, result.episodes) == (6, 1, 2)
    assert spark.read.parquet(str(out / "send_delays")).count() == 0
    assert spark.read.parquet(str(out / "advice")).select("producers").collect() == [(None,)]
    assert "report.html" in {p.name for p in out.iterdir()}


def _persisted(spark: SparkSession) -> set[int]:
    """Ids of the RDDs the session's context holds blocks for (cached or checkpointed)."""
    return {int(i) for i in spark.sparkContext._jsc.getPersistentRDDs()}


def test_analyze_drops_the_rows_it_kept(
    spark: SparkSession,
    tmp_path: Path,
    logs: tuple[list[str], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events, client = logs
    before = _persisted(spark)
    kept: list[int] = []
    # Watch what the run keeps, so the test cannot pass by keeping nothing.
    # (Patched on the session's own DataFrame class, Spark's "classic" one.)
    frame_class = type(spark.range(1))
    original = frame_class.localCheckpoint

    def watched(self: DataFrame, *args: Any, **kwargs: Any) -> DataFrame:
        result = original(self, *args, **kwargs)
        kept.append(int(result._jdf.queryExecution().analyzed().rdd().id()))
        return result

    monkeypatch.setattr(frame_class, "localCheckpoint", watched)
    analyze(spark, events, tmp_path / "out", client_paths=client)
    monkeypatch.undo()
    assert len(kept) >= 5
    assert not before & set(kept)
    assert _persisted(spark) == before


def test_analyze_again_compiles_no_code(
    spark: SparkSession, tmp_path: Path, logs: tuple[list[str], list[str]]
) -> None:
    events, client = logs
    analyze(spark, events, tmp_path / "first", client_paths=client)
    # A run generates more classes than Spark's default cache of 100 holds:
    # without the job's larger cache, this run would compile most again.
    before = compiled_classes(spark)
    analyze(spark, events, tmp_path / "second", client_paths=client)
    assert compiled_classes(spark) - before == 0


@pytest.mark.parametrize("which", ["events", "client"])
def test_analyze_refuses_a_path_that_matches_nothing_before_writing(
    spark: SparkSession, tmp_path: Path, logs: tuple[list[str], list[str]], which: str
) -> None:
    events, client = logs
    missing = [str(tmp_path / "nowhere-*.jsonl")]
    out = tmp_path / "out"
    with pytest.raises(AnalysisException, match="PATH_NOT_FOUND"):
        analyze(
            spark,
            missing if which == "events" else events,
            out,
            client_paths=missing if which == "client" else client,
        )
    assert list(out.iterdir()) == []


def test_parse_queue_limits_reads_own_and_management_formats() -> None:
    document = [
        {"vhost": "/", "queue": "a", "max_count": 1000},
        {"vhost": "v", "name": "b", "arguments": {"x-max-length-bytes": 5000}},
        {"name": "c", "effective_policy_definition": {"max-length": 70}},
        {"name": "d"},
    ]
    assert parse_queue_limits({"queues": document}) == [
        ("/", "a", 1000, None),
        ("v", "b", None, 5000),
        ("/", "c", 70, None),
        ("/", "d", None, None),
    ]


def test_parse_queue_limits_reads_qpid_maxima_of_a_management_snapshot() -> None:
    document = [{"name": "q", "vhost": "/", "arguments": {"qpid.max_count": 500}}]
    assert parse_queue_limits(document) == [("/", "q", 500, None)]


def gateway_api_queues() -> list[dict[str, Any]]:
    """``GET /api/queues`` of a real gateway hub, as its admin API serialises it."""
    gateway = Gateway(GatewayConfig(), sink=lambda _: None)
    reject = {"x-overflow": "reject-publish"}
    gateway.queue_declared("/", "bounded", {"x-max-length": 1000, **reject})
    gateway.queue_declared("/", "odd", {"x-max-length": 1001, **reject})
    gateway.queue_declared("v", "bytes", {"x-max-length-bytes": 50_000, **reject})
    gateway.queue_declared("/", "own", {"qpid.flow_stop_count": 10})
    gateway.queue_declared("/", "plain", {})
    result: list[dict[str, Any]] = json.loads(
        json.dumps([s.to_json() for s in gateway.snapshots()])
    )
    return result


def test_parse_queue_limits_finds_the_maxima_of_a_gateway_snapshot() -> None:
    limits = parse_queue_limits(gateway_api_queues())
    assert sorted(limits, key=lambda row: row[1]) == [
        ("/", "bounded", 1000, None),
        # 1001 * 80% rounds down to the same stop as 1000: the smaller maximum is taken.
        ("v", "bytes", None, 50_000),
        ("/", "odd", 1000, None),
        ("/", "own", None, None),
        ("/", "plain", None, GatewayConfig().default_queue_limit),
    ]


def test_parse_queue_limits_derives_with_the_gateways_stop_percentage() -> None:
    snapshot = [
        {"name": "q", "vhost": "/", "source": "default", "flowStopCount": 500, "flowStopSize": 0}
    ]
    assert parse_queue_limits(snapshot, default_stop_pct=50) == [("/", "q", 1000, None)]


def test_parse_queue_limits_prefers_a_maximum_the_gateway_shows() -> None:
    snapshot = [{"name": "q", "source": "arguments", "flowStopCount": 10, "maxCount": 300}]
    assert parse_queue_limits(snapshot) == [("/", "q", 300, None)]


def test_parse_queue_limits_refuses_an_entry_without_a_name() -> None:
    with pytest.raises(QueueLimitsError, match="entry 1 has no queue name"):
        parse_queue_limits([{"name": "a"}, {"max_count": 3}])


def test_parse_queue_limits_refuses_a_non_list() -> None:
    with pytest.raises(QueueLimitsError, match="JSON list"):
        parse_queue_limits(json.loads('"nope"'))


@pytest.mark.parametrize(
    "options",
    [
        ["--follow", "--trigger", "0"],
        ["--incremental", "--lateness", "-1"],
        ["--master", "local[1]", "--remote", "sc://127.0.0.1:15002"],
    ],
)
def test_live_options_are_checked_before_spark_starts(
    tmp_path: Path, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gw.jsonl", "--out", str(tmp_path), *options]) == 2
    assert "rabbitflow-analyze:" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["--incremental", "--follow"])
def test_a_live_run_on_a_mistyped_path_says_so_and_writes_nothing(
    spark: SparkSession, tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    missing = str(tmp_path / "evnets.jsonl")
    assert main([missing, "--out", str(out), mode], spark=spark) == 2
    assert f"rabbitflow-analyze: error: {missing}: no such file or directory" in (
        capsys.readouterr().err
    )
    assert not (out / "_state" / "commit.json").exists()


def test_incremental_and_follow_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["gw.jsonl", "--out", str(tmp_path), "--incremental", "--follow"])


@pytest.mark.parametrize("job", ["batch", "incremental"])
def test_report_times_are_utc_whatever_the_local_time_zone(
    spark: SparkSession, tmp_path: Path, logs: tuple[list[str], list[str]], job: str
) -> None:
    events, client = logs
    out = tmp_path / "out"
    # The store episode starts at 05:00:35 UTC; in Kolkata (UTC+5:30, no
    # daylight saving) that is 10:30:35, which a report reading times in the
    # process's zone would show, labelled UTC.
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    try:
        # The zone is known here (else the test could not see the fault).
        assert time.strftime("%H:%M", time.localtime(0)) == "05:30"
        if job == "batch":
            analyze(spark, events, out, client_paths=client)
        else:
            run_step(spark, events, out, client_paths=client, live=True)
    finally:
        os.environ["TZ"] = "UTC"
        time.tzset()
    report = (out / "report.html").read_text()
    store = report[report.index("Store episodes") :]
    assert "2026-11-22 05:00:35" in store
    assert "10:30:35" not in report
    assert "10:30:30" not in report  # the open queue episode, shown at the top of a live report
