"""A new owner's epoch is above every epoch the cluster ever took, also when
it owns before it has heard from any other member.

Each member is its own ``rabbitflow-broker --cluster NAME`` process in front
of the shared RabbitMQ.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from integration.broker.conftest import wait_for
from integration.cluster._members import Member, cluster_name, forget_cluster
from integration.conftest import Broker

LEASE_MS = 1000


def _owns(member: Member) -> bool:
    view = member.cluster_view()
    return bool(view["owner"] == view["member"])


def _record(broker: Broker, name: str) -> list[int]:
    """The epochs the cluster's epochs record holds (read, and put back)."""
    connection = broker.blocking_connection()
    try:
        channel = connection.channel()
        method, _, body = channel.basic_get(f"rabbitflow.cluster.{name}.epochs", auto_ack=False)
        if method is None:
            return []
        channel.basic_reject(method.delivery_tag, requeue=True)
        return [int(json.loads(body)["e"]), method.message_count]
    finally:
        connection.close()


@pytest.mark.slow
def test_a_member_started_after_the_owner_left_takes_an_epoch_above_it(
    broker: Broker, tmp_path: Path
) -> None:
    # The first owner leaves; its heartbeats in the owner queue expire, so the
    # next member to start hears no message carrying its epoch before RabbitMQ
    # hands it the owner queue.  Sharing the epoch (and so the grant ids) would
    # let it grant beside grants of its predecessor still in use.
    name = cluster_name()
    first = Member(broker, tmp_path, name, 0, cluster_lease=LEASE_MS)
    later = Member(broker, tmp_path, name, 1, cluster_lease=LEASE_MS)
    try:
        first.start()
        wait_for(lambda: _owns(first), timeout=10, what="the first member owning")
        epoch = first.cluster_view()["epoch"]
        first.stop()
        time.sleep(3 * LEASE_MS / 1000)  # its messages in the owner queue have expired
        later.start()
        wait_for(lambda: _owns(later), timeout=10, what="the later member owning")
        assert later.cluster_view()["epoch"] > epoch
        # RabbitMQ keeps the last epoch taken, alone (messages left behind it: 0).
        assert _record(broker, name) == [later.cluster_view()["epoch"], 0]
    finally:
        for member in (first, later):
            member.stop()
        forget_cluster(broker, name)
        for member in (first, later):
            print(f"--- member {member.index} log ---\n{member.log()[-4000:]}")
