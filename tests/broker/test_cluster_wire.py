"""The cluster's control messages read back what was written, as JSON."""

from __future__ import annotations

import json
import math

import pytest

from rabbitflow_broker.engine.cluster import Grant, Report, Request
from rabbitflow_broker.engine.cluster_settings import SharedThresholds
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


def test_thresholds_read_back_as_sent_and_their_stamp_merges_as_kept() -> None:
    thresholds = Thresholds(stop_count=1000, resume_count=500, stop_size=0, resume_size=0)
    mine = SharedThresholds("m1")
    mine.set(KEY, thresholds)
    message = _over_the_wire(thresholds_message("m1", KEY, thresholds, mine.wire([KEY])))
    assert read_thresholds(message) == (KEY, thresholds)  # as a member without stamps reads it
    stamps = message["tv"]
    assert isinstance(stamps, list)
    theirs = SharedThresholds("m2")
    assert theirs.merge(stamps) == ({KEY: thresholds}, [])
    assert theirs.stamps == mine.stamps


def test_runtime_thresholds_gone_with_their_queue_stay_gone_against_an_older_stamp() -> None:
    older = SharedThresholds("m1")
    older.set(KEY, Thresholds(stop_count=10))
    gone = SharedThresholds("m2")
    gone.merge(older.wire())
    gone.set(KEY, None)  # the queue was deleted: a newer stamp
    assert gone.merge(older.wire()) == ({}, [KEY])  # kept gone, and said again
    assert older.merge(gone.wire()) == ({KEY: None}, [])
    assert older.in_force() == {}


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
