"""A new owner's epoch is above every epoch ever taken, and it acts as owner
only once RabbitMQ confirmed its record of it.

The epochs record is the quorum queue ``rabbitflow.cluster.NAME.epochs``,
kept here by a :class:`~tests.broker.cluster_link.FakeBus` that answers as
RabbitMQ does: a Basic.Get's answer (the last epoch recorded, or empty),
then a publisher confirm, each when the test says (``hold=True``).
"""

from __future__ import annotations

from typing import Any

from rabbitflow_broker.server.cluster_node import ClusterNode
from tests.broker.cluster_link import EpochsRecord, FakeBus
from tests.broker.test_cluster_node import KEY, Clock, _request, _sending


def _bus(node: ClusterNode) -> FakeBus:
    bus = node.bus
    assert isinstance(bus, FakeBus)
    return bus


def _grants(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in sent if m["t"] == "grant"]


def _claiming(record: EpochsRecord) -> tuple[Clock, ClusterNode, FakeBus, list[dict[str, Any]]]:
    """A clock, and member "a" whose bus holds RabbitMQ's answers
    (``hold=True``), handed the owner queue: it has asked ``record`` for the
    last epoch and waits for the answer."""
    clock = Clock()
    node, _, sent = _sending("a", clock, record, hold=True)
    node._dispatch({"t": "hello", "m": "a", "e": 0}, True)
    return clock, node, _bus(node), sent


def test_an_owner_whose_record_read_says_a_later_epoch_takes_one_above_it() -> None:
    # The members' heartbeats said epoch 4 (the last they heard of), but the
    # owner that died had taken 5 (its state never reached anyone): RabbitMQ's
    # record says so.  Sharing epoch 5 would make its grants' ids collide with
    # the new owner's, and their use, reported late, be dropped.
    clock = Clock()
    owner, gateway, _ = _sending("c", clock, EpochsRecord(5))
    owner._dispatch({"t": "hello", "m": "b", "e": 4}, True)
    assert owner.epoch == 6
    report = {
        "t": "rep",
        "m": "b",
        "v": KEY[0],
        "q": KEY[1],
        "a": None,
        "r": [[(5 << 32) + 1, 10, 0, True, 1000, 0]],  # b used 10 of the predecessor's grant
    }
    owner._dispatch(report, False)
    assert gateway.depth.get(KEY).messages == 10


def test_an_owner_acts_only_once_rabbitmq_confirmed_its_epoch() -> None:
    record = EpochsRecord()
    clock, owner, bus, sent = _claiming(record)  # handed the owner queue
    owner._dispatch(_request("b", clock), True)  # b asks meanwhile
    bus.answer(1)  # the record is empty: a cluster that never had an owner
    assert record.epoch == 1  # recorded, not confirmed yet
    assert not owner.owner
    assert not [m for m in sent if m["t"] in ("state", "grant")]
    bus.answer()  # RabbitMQ's confirm
    assert owner.owner
    assert owner.epoch == 1
    assert [m["e"] for m in sent if m["t"] == "state"] == [1]
    assert [m["e"] for m in _grants(sent)] == [1]  # b's request, kept meanwhile, answered


def test_a_claim_whose_bus_is_lost_never_owns_and_the_next_one_reads_again() -> None:
    _, node, bus, sent = _claiming(EpochsRecord(3))
    bus.answer(1)  # read 3: claims 4
    bus.lose()  # before the confirm: it never comes
    assert not node.owner
    assert not [m for m in sent if m["t"] == "state"]
    bus.connected = True  # connected again, handed the owner queue again
    node._dispatch({"t": "hello", "m": "a", "e": 0}, True)
    bus.answer()
    assert bus.reads == 2
    assert node.owner
    assert node.epoch == 5  # its lost record of 4 landed: above it


def test_an_owner_that_hears_a_higher_epoch_steps_down_and_claims_above_it() -> None:
    # The record was lost (the epochs queue deleted by hand): the new owner
    # takes epoch 1 and grants at once.  A member still holding epoch 5 (its
    # heartbeats say so) would refuse every grant and state of epoch 1.
    clock = Clock()
    member, member_gateway, member_sent = _sending("b", clock)
    member._dispatch({"t": "state", "m": "old", "e": 5, "on": [], "stops": [], "d": []}, False)
    owner, _, owner_sent = _sending("c", clock)
    owner._dispatch({"t": "hello", "m": "c", "e": 0}, True)
    assert owner.epoch == 1
    member_gateway.published("/", frozenset({"orders"}), 10)  # held: no allowance
    member.owner_id = None  # it asks through the owner queue
    for _ in range(12):
        clock.now += 0.5
        member.tick(clock.now)
        owner.tick(clock.now)
        for message in [m for m in member_sent if m["t"] in ("req", "hello")]:
            owner._dispatch(message, True)  # the owner queue
        member_sent.clear()
        for message in [m for m in owner_sent if m["t"] in ("grant", "state")]:
            member._dispatch(message, False)
        owner_sent.clear()
    assert owner.owner
    assert owner.epoch == 6
    assert KEY not in member.book.held


def test_a_claim_that_hears_an_epoch_as_high_as_its_own_claims_again() -> None:
    record = EpochsRecord(2)
    _, node, bus, _ = _claiming(record)
    bus.answer(1)  # read 2: claims 3
    # Another member owns with epoch 3 (its record landed before this one's).
    node._dispatch({"t": "state", "m": "z", "e": 3, "on": [], "stops": [], "d": []}, False)
    bus.answer()  # 3 confirmed; read again (3), record and confirm 4
    assert node.owner
    assert node.epoch == 4
    assert record.epoch == 4


def test_the_first_owner_of_a_cluster_whose_record_is_empty_grants_at_once() -> None:
    clock = Clock()
    record = EpochsRecord()
    first, _, sent = _sending("a", clock, record)
    first._dispatch({"t": "hello", "m": "a", "e": 0}, True)
    first._dispatch(_request("c", clock), True)
    assert first.epoch == 1
    assert _grants(sent)
    # A member that joins later, hearing nothing, is told by the record.
    later, _, later_sent = _sending("b", clock, record)
    later._dispatch({"t": "hello", "m": "b", "e": 0}, True)
    later._dispatch(_request("c", clock), True)
    assert later.epoch == 2
    assert not _grants(later_sent)
