"""The collector policy: thresholds, the periodic full collection, its counts."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from rabbitflow_broker.server.gc_policy import CollectorPolicy, CollectorSettings


class FakeCollector:
    """Stands for ``gc.collect``: records the generations asked for, finds ``found``."""

    def __init__(self, found: int) -> None:
        self.found = found
        self.generations: list[int] = []

    def __call__(self, generation: int) -> int:
        self.generations.append(generation)
        return self.found


class FakeClock:
    """Advances ``step`` seconds per reading."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_full_collection_is_counted_and_timed() -> None:
    collector = FakeCollector(found=7)
    policy = CollectorPolicy(collect=collector, clock=FakeClock(0.002))
    assert policy.collect_now() == 7
    collector.found = 3
    policy.collect_now()
    stats = policy.stats()
    assert collector.generations == [2, 2]
    assert (stats["full_collections"], stats["freed"], stats["last_freed"]) == (2, 10, 3)
    assert stats["last_duration_ms"] == pytest.approx(2.0)


def test_a_slow_pass_stretches_the_interval_to_keep_within_the_budget() -> None:
    clock = FakeClock(0.05)
    settings = CollectorSettings(full_interval=10.0, budget=0.01)
    policy = CollectorPolicy(settings, collect=FakeCollector(found=0), clock=clock)
    assert policy.next_interval() == 10.0
    policy.collect_now()  # 50 ms: within 1% of 10 s
    assert policy.next_interval() == 10.0
    clock.step = 0.3
    policy.collect_now()  # 300 ms: the next waits 30 s
    assert policy.next_interval() == pytest.approx(30.0)
    clock.step = 0.01
    policy.collect_now()
    assert policy.next_interval() == 10.0
    assert policy.stats()["longest_ms"] == pytest.approx(300.0)


@pytest.mark.parametrize(
    "options",
    [{"young": 0}, {"middle": 0}, {"old": -1}, {"full_interval": -1.0}, {"budget": 0.0}],
    ids=["young", "middle", "old", "interval", "budget"],
)
def test_settings_refuse_what_would_stop_or_break_the_collector(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        CollectorSettings(**options)  # type: ignore[arg-type]


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_install_sets_the_thresholds_and_freezes_what_is_loaded() -> None:
    CollectorPolicy(CollectorSettings(young=12_345, middle=6, old=7)).install()
    assert gc.get_threshold() == (12_345, 6, 7)
    assert gc.get_freeze_count() > 0


@pytest.mark.asyncio
async def test_run_collects_every_interval_until_cancelled() -> None:
    collector = FakeCollector(found=0)
    policy = CollectorPolicy(CollectorSettings(full_interval=0.001), collect=collector)
    task = asyncio.create_task(policy.run())
    async with asyncio.timeout(5):
        while policy.full_collections < 3:
            await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert collector.generations[:3] == [2, 2, 2]


@pytest.mark.asyncio
async def test_run_without_an_interval_never_collects() -> None:
    collector = FakeCollector(found=0)
    policy = CollectorPolicy(CollectorSettings(full_interval=0), collect=collector)
    await asyncio.wait_for(policy.run(), 1)
    assert collector.generations == []
