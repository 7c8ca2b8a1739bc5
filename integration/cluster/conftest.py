"""Fixtures for several gateways sharing one flow state (each its own process)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.cluster._members import Member, cluster_name, forget_cluster
from integration.conftest import Broker


@pytest.fixture
def cluster_members(broker: Broker, tmp_path: Path) -> Iterator[Callable[..., list[Member]]]:
    """``start(n, **options)``: n members of a new cluster, started and ready."""
    started: list[Member] = []
    names: list[str] = []

    def start(n: int, **options: Any) -> list[Member]:
        name = cluster_name()
        names.append(name)
        members = []
        for _ in range(n):
            member = Member(broker, tmp_path, name, len(started), **options)
            started.append(member)
            members.append(member.start())
        return members

    yield start
    for member in started:
        with contextlib.suppress(Exception):
            member.stop()
    for name in names:
        forget_cluster(broker, name)
    for member in started:
        # Shown by pytest only for a failing test.
        print(f"--- member {member.index} log ---\n{member.log()[-6000:]}")
