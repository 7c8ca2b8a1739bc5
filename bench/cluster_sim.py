"""Cluster simulation: the bound, the peak depth and the control traffic of 10 to 100 members.

The cluster's pure allowance logic (``rabbitflow_broker.engine.cluster``: each
member's allowance, the queue owner's ledger) runs in the seeded simulation
the model tests use (``tests/broker/cluster_sim.py``): members relay the
publishes of producers with fixed capacities into one queue, hold
completions they have no allowance for, and talk to the queue's owner over
a bus that delays messages (up to ``--max-delay`` ms) and drops some
(``--drop``), all on one simulated clock.  Here producers publish at a
given total rate (Poisson), spread evenly over the members, and a consumer
takes messages at a fraction of that rate, straight from RabbitMQ or
through a member (half each), so the queue reaches its stop threshold and
the flow state turns on and off for the whole run.

For each member count and publish rate it prints the bound ``stop + Σc +
M x batch``, the peak depth reached, how often the queue stopped, and the
control messages sent per 1,000 messages published: allowance requests,
grants, use/removal reports and flow updates, a broadcast counted once (it
is one publish to the cluster's exchange, as ``controlMessages.sent`` in
``GET /api/cluster`` counts it).  Membership heartbeats are not in that
figure: each member sends one per quarter lease whatever the traffic (4
per second per member with the default lease of 2 s).

Run: ``.venv/bin/python bench/cluster_sim.py`` (about ten seconds);
``--members 10,50 --rates 2000,20000 --seconds 5`` picks the grid.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rabbitflow_broker.engine.cluster import FlowUpdate
from rabbitflow_broker.engine.cluster_book import REPORT_EVERY_S
from tests.broker.cluster_sim import STEP, Bus, Member, Producer, Simulation

#: Simulated seconds of the run that finds the rate the producers reach.
CALIBRATION_S = 1.0


class CountingBus(Bus):
    """The simulation's bus, counting what members and owner send."""

    sent: int = 0
    #: While set, sends are the copies of one broadcast (counted once by the caller).
    fanning_out: bool = False

    def send(self, to: str, message: Any) -> None:
        if not self.fanning_out:
            self.sent += 1
        super().send(to, message)


class RatedSimulation(Simulation):
    """The model test's simulation with producers publishing at a set rate."""

    def __init__(self, seed: int, *, rate: float, **kwargs: Any) -> None:
        super().__init__(seed, **kwargs)
        self.bus = CountingBus(self.rng, self.bus.max_delay, self.bus.drop)
        self.rate_each = rate / len(self.producers)
        self.published = 0
        self._reported_at = [0.0] * len(self.members)

    def _publish(self, producer: Producer) -> None:
        for _ in range(self._poisson(self.rate_each * STEP)):
            sent = producer.next_seq
            super()._publish(producer)
            if producer.next_seq == sent:  # held back: flowed or its window full
                return
            self.published += 1

    def _member_turn(self, member: Member) -> None:
        """As a gateway's round does it: reports ride on the requests, and
        what is left goes in one message at most every ``REPORT_EVERY_S``."""
        allowance = member.allowance
        while member.held and allowance.take(self.now):
            pid, seq = member.held.pop(0)
            self._confirm(self.producers[pid], seq)
        request = allowance.wants(self.now)
        if request is not None:
            self.bus.send("owner", request)  # carries the member's reports
            self._reported_at[member.index] = self.now
        elif self.now - self._reported_at[member.index] >= REPORT_EVERY_S:
            reports = allowance.reports(self.now)
            if reports:
                self._reported_at[member.index] = self.now
                self._send_as_one(["owner"] * len(reports), reports)

    def _broadcast(self, update: FlowUpdate) -> None:
        # One publish to the cluster's exchange, routed to every member's queue.
        self._send_as_one([f"m{m.index}" for m in self.members], [update] * len(self.members))

    def _send_as_one(self, to: list[str], messages: list[Any]) -> None:
        bus = self.bus
        assert isinstance(bus, CountingBus)
        bus.sent += 1
        bus.fanning_out = True
        try:
            for address, message in zip(to, messages, strict=True):
                bus.send(address, message)
        finally:
            bus.fanning_out = False


def run_one(
    members: int,
    rate: float,
    *,
    seconds: float,
    consume_share: float,
    direct_share: float,
    stop: int,
    resume: int,
    batch: int,
    capacity: int,
    producers_per_member: int,
    drop: float,
    max_delay: float,
    seed: int,
) -> dict[str, float]:
    def simulation(stop: int, resume: int) -> RatedSimulation:
        return RatedSimulation(
            seed,
            rate=rate,
            members=members,
            capacities=[capacity] * (members * producers_per_member),
            stop=stop,
            resume=resume,
            batch=batch,
            drop=drop,
            max_delay=max_delay,
        )

    # What the producers achieve with a consumer that keeps up (allowance round
    # trips can hold them below the rate asked for) ...
    probe = simulation(0, 0)
    while probe.now < CALIBRATION_S:
        probe.step(consume_rate=rate, direct_share=direct_share)
    achievable = probe.published / probe.now
    # ... and the run: a consumer at a share of that, so the queue reaches its stop.
    sim = simulation(stop, resume)
    while sim.now < seconds:
        sim.step(consume_rate=achievable * consume_share, direct_share=direct_share)
        if sim.depth > sim.bound:
            raise AssertionError(f"depth {sim.depth} over the bound {sim.bound} at {sim.now:.2f} s")
    assert isinstance(sim.bus, CountingBus)
    return {
        "bound": sim.bound,
        "peak": sim.peak,
        "stops": sim.owner.flow_stopped_count,
        "published": sim.published,
        "achievable": achievable,
        "control": sim.bus.sent,
        "per_1000": 1000 * sim.bus.sent / max(sim.published, 1),
    }


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=_ints, default=[10, 25, 50, 100], help="10,25,50,100")
    parser.add_argument(
        "--rates", type=_ints, default=[2000, 10000, 40000], help="total msg/s (2000,10000,40000)"
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="simulated seconds (8)")
    parser.add_argument(
        "--consume-share",
        type=float,
        default=0.8,
        help="the consumer's rate as a share of the rate the producers reach with a "
        "consumer that keeps up (0.8: the queue grows to its stop threshold)",
    )
    parser.add_argument(
        "--direct-share",
        type=float,
        default=0.0,
        help="share of the consumed messages taken straight from RabbitMQ, unseen by the "
        "members (0: every consumer goes through a member)",
    )
    parser.add_argument("--stop", type=int, default=1000)
    parser.add_argument("--resume", type=int, default=500)
    parser.add_argument("--batch", type=int, default=100, help="--cluster-batch (100)")
    parser.add_argument("--capacity", type=int, default=10, help="each producer's capacity")
    parser.add_argument("--producers-per-member", type=int, default=2)
    parser.add_argument("--drop", type=float, default=0.0, help="share of control messages lost")
    parser.add_argument("--max-delay", type=float, default=5.0, help="bus delay, ms (0..this)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(
        f"stop {args.stop:,}, resume {args.resume:,}, batch {args.batch}, "
        f"{args.producers_per_member} producers of capacity {args.capacity} per member, "
        f"consumer at {args.consume_share:.0%} of the rate reached "
        f"({args.direct_share:.0%} of it straight from RabbitMQ), bus delay 0-{args.max_delay} "
        f"ms, {args.drop:.0%} dropped, {args.seconds} simulated s, seed {args.seed}"
    )
    print(
        f"{'members':>7} {'msg/s':>7} {'reached':>8} {'bound':>7} {'peak':>7} {'peak/bound':>10} "
        f"{'stops':>5} {'published':>10} {'control':>8} {'ctl/1000 msgs':>13}"
    )
    started = time.monotonic()
    for members in args.members:
        for rate in args.rates:
            row = run_one(
                members,
                rate,
                seconds=args.seconds,
                consume_share=args.consume_share,
                direct_share=args.direct_share,
                stop=args.stop,
                resume=args.resume,
                batch=args.batch,
                capacity=args.capacity,
                producers_per_member=args.producers_per_member,
                drop=args.drop,
                max_delay=args.max_delay / 1000,
                seed=args.seed,
            )
            print(
                f"{members:>7} {rate:>7,} {row['achievable']:>8,.0f} {row['bound']:>7,} "
                f"{row['peak']:>7,} "
                f"{row['peak'] / row['bound']:>10.2f} {row['stops']:>5} "
                f"{row['published']:>10,} {row['control']:>8,} {row['per_1000']:>13.1f}",
                flush=True,
            )
    print(f"({time.monotonic() - started:.1f} s of wall time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
