"""The cluster's allowance logic under a bus that delays, drops and reorders,
with members and owners crashing: the bound holds at every step and a
drained queue is always released (a seeded simulation, see cluster_sim)."""

from __future__ import annotations

import pytest

from rabbitflow_broker.engine.cluster import MAX_GRANT_BATCHES
from tests.broker.cluster_sim import Simulation

SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("members", [2, 3, 10, 50])
@pytest.mark.parametrize("room_grants", [False, True])
def test_the_bound_holds_and_a_drained_queue_is_released(
    seed: int, members: int, room_grants: bool
) -> None:
    sim = Simulation(
        seed,
        room_grants=room_grants,
        members=members,
        capacities=[5 + (i * 7) % 20 for i in range(max(members, 6))],
        stop=300,
        resume=150,
        batch=50,
        drop=0.05,
        max_delay=0.02,
    )
    sim.run(chaos_s=6.0, consume_rate=50, direct_share=0.5)
    assert sim.owner.flow_stopped_count >= 1  # the run did reach the stop


@pytest.mark.parametrize("seed", SEEDS)
def test_grants_of_fast_members_grow_and_the_bound_still_holds(seed: int) -> None:
    # Far below a high stop threshold, members that use their grants fast get
    # doubled ones (past MAX_GRANT_BATCHES batches), until the room runs out.
    sim = Simulation(
        seed,
        room_grants=True,
        members=3,
        capacities=[30] * 6,
        stop=2000,
        resume=1000,
        batch=5,
        drop=0.05,
        max_delay=0.02,
    )
    sim.run(chaos_s=12.0, consume_rate=50, direct_share=0.5)
    assert sim.largest_grant > MAX_GRANT_BATCHES * 5
    assert sim.owner.flow_stopped_count >= 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("room_grants", [False, True])
def test_member_and_owner_crashes_keep_the_bound(seed: int, room_grants: bool) -> None:
    sim = Simulation(
        seed,
        room_grants=room_grants,
        members=5,
        capacities=[10] * 10,
        stop=200,
        resume=100,
        batch=20,
        drop=0.1,
        max_delay=0.05,
        crash_rate=0.3,
        owner_crash_rate=0.2,
    )
    sim.run(chaos_s=10.0, consume_rate=50, direct_share=0.5)
    assert sim.owner.flow_stopped_count >= 1 or sim.owner.epoch > 1


def test_a_member_cut_off_past_the_lease_holds_every_completion() -> None:
    sim = Simulation(0, members=2, capacities=[10, 10], stop=100, resume=50, batch=20, drop=0.0)
    for _ in range(100):
        sim.step(consume_rate=0, direct_share=1.0)
    sim.bus.drop = 1.0  # nothing reaches the owner or the members any more
    confirmed = [p.confirmed for p in sim.producers]
    for _ in range(int(sim.lease / 0.01) + 50):
        sim.step(consume_rate=0, direct_share=1.0)
    after = [p.confirmed for p in sim.producers]
    for _ in range(100):
        sim.step(consume_rate=0, direct_share=1.0)
    assert [p.confirmed for p in sim.producers] == after  # nothing completes any more
    assert after >= confirmed
    assert sim.depth <= sim.bound
