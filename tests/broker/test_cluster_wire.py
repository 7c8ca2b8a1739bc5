"""The cluster's control messages read back what was written, as JSON."""

from __future__ import annotations

import json
import math

import pytest

from rabbitflow_broker.engine.cluster import Grant, Report, Request
from rabbitflow_broker.engine.cluster_wire import (
    grant_message,
    queue_key,
    queue_name,
    read_grant,
    read_thresholds,
    request_message,
    thresholds_message,
)
from rabbitflow_broker.engine.flow import Thresholds

KEY = ("/v", "orders")


def _over_the_wire(message: dict[str, object]) -> dict[str, object]:
    return dict(json.loads(json.dumps(message)))


def test_a_queue_name_splits_back_into_vhost_and_queue() -> None:
    assert queue_key(queue_name(KEY)) == KEY


def test_a_grant_reads_back_as_sent() -> None:
    grant = Grant("m2", queue_name(KEY), (3 << 32) + 7, 150, 12.5, 3)
    assert read_grant("m2", _over_the_wire(grant_message(KEY, grant))) == (KEY, grant)


def test_thresholds_read_back_as_sent() -> None:
    thresholds = Thresholds(stop_count=1000, resume_count=500, stop_size=0, resume_size=0)
    message = _over_the_wire(thresholds_message("m1", KEY, thresholds))
    assert read_thresholds(message) == (KEY, thresholds)


@pytest.mark.parametrize(("asked_at", "kind"), [(4.25, "req"), (math.nan, "rep")])
def test_a_request_is_req_when_asking_and_rep_with_reports_only(asked_at: float, kind: str) -> None:
    report = Report("m1", queue_name(KEY), 9, 40, 3, False, 4000, 300)
    message = _over_the_wire(
        request_message("m1", Request("m1", queue_name(KEY), asked_at, (report,)))
    )
    assert message["t"] == kind
    assert (message["v"], message["q"]) == KEY
    assert message["a"] == (None if kind == "rep" else asked_at)
    assert message["r"] == [[9, 40, 3, False, 4000, 300]]


def test_a_malformed_message_raises_what_the_node_ignores() -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        read_grant("m1", {"t": "grant", "v": "/", "q": "x", "g": "seven"})
