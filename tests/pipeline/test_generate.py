"""The generator writes exactly the gateway's records, in time order, with the asked count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rabbitflow_broker.events import event_from_record
from rabbitflow_pipeline.generate import generate


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("gen")
    return generate(
        out, events=3000, queues=12, days=0.5, gateways=3, processes=1, client_fraction=0.5
    )


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generator_writes_exactly_the_requested_number_of_events(logs: list[Path]) -> None:
    assert sum(len(records(p)) for p in logs) == 3000


def test_generated_lines_are_what_the_event_classes_render(logs: list[Path]) -> None:
    for path in logs:
        for record in records(path):
            assert event_from_record(record).to_record() == record


def test_each_gateway_log_is_in_time_order(logs: list[Path]) -> None:
    for path in logs:
        stamps = [str(r["ts"]) for r in records(path)]
        assert stamps == sorted(stamps)


def test_generator_writes_client_logs_for_some_producers(logs: list[Path]) -> None:
    client = list(logs[0].parent.glob("client-*.jsonl"))
    flow_events = {r["flow_event"] for p in client for r in records(p)}
    assert flow_events >= {"flow_enforced", "flow_removed", "send_delayed"}


def test_generator_refuses_fewer_queues_than_gateways(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one queue per gateway"):
        generate(tmp_path, events=10, queues=2, gateways=3)
