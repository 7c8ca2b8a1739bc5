import pytest

from rabbitflow._flow import (
    GATE_TRANSITIONS,
    ConnectionBlocked,
    ConnectionUnblocked,
    FlowEnforced,
    FlowGate,
    FlowRemoved,
    Gate,
    GateEvent,
    IllegalTransitionError,
)


def test_gate_starts_open() -> None:
    assert FlowGate().is_open


def test_flow_off_closes_the_gate_and_announces_enforcement() -> None:
    gate = FlowGate()
    assert gate.handle(GateEvent.FLOW_OFF) == [FlowEnforced()]
    assert (gate.state, gate.is_open) == (Gate.FLOWED, False)


def test_flow_on_reopens_and_announces_removal() -> None:
    gate = FlowGate(Gate.FLOWED)
    assert gate.handle(GateEvent.FLOW_ON) == [FlowRemoved()]
    assert gate.is_open


def test_repeated_flow_off_announces_once() -> None:
    gate = FlowGate(Gate.FLOWED)
    assert gate.handle(GateEvent.FLOW_OFF) == []


def test_blocked_and_flowed_need_both_lifted() -> None:
    gate = FlowGate()
    gate.handle(GateEvent.BLOCKED, "memory")
    gate.handle(GateEvent.FLOW_OFF)
    gate.handle(GateEvent.UNBLOCKED)
    assert gate.state is Gate.FLOWED
    gate.handle(GateEvent.FLOW_ON)
    assert gate.is_open


def test_blocked_notice_carries_the_reason() -> None:
    assert FlowGate().handle(GateEvent.BLOCKED, "low on memory") == [
        ConnectionBlocked("low on memory")
    ]


def test_unblocked_notice() -> None:
    assert FlowGate(Gate.BLOCKED).handle(GateEvent.UNBLOCKED) == [ConnectionUnblocked()]


def test_connection_loss_clears_flow_without_announcing_removal_twice() -> None:
    gate = FlowGate(Gate.FLOWED)
    assert gate.handle(GateEvent.CONNECTION_LOST) == [FlowRemoved()]
    assert gate.state is Gate.DISCONNECTED
    assert gate.handle(GateEvent.RECONNECTED) == []
    assert gate.is_open


def test_illegal_event_names_state_and_event() -> None:
    with pytest.raises(IllegalTransitionError, match=r"FLOW_OFF.*DISCONNECTED"):
        FlowGate(Gate.DISCONNECTED).handle(GateEvent.FLOW_OFF)


def test_closed_is_final() -> None:
    gate = FlowGate()
    gate.handle(GateEvent.CLOSE)
    with pytest.raises(IllegalTransitionError):
        gate.handle(GateEvent.FLOW_ON)


def test_every_live_state_can_lose_its_connection_and_close() -> None:
    for state in (Gate.OPEN, Gate.FLOWED, Gate.BLOCKED, Gate.FLOWED_BLOCKED):
        assert GATE_TRANSITIONS[(state, GateEvent.CONNECTION_LOST)] is Gate.DISCONNECTED
        assert GATE_TRANSITIONS[(state, GateEvent.CLOSE)] is Gate.CLOSED


def test_blocked_while_disconnected_is_kept_for_the_reconnection() -> None:
    gate = FlowGate(Gate.DISCONNECTED)
    assert gate.handle(GateEvent.BLOCKED, "memory") == [ConnectionBlocked("memory")]
    assert (gate.state, gate.disconnected) == (Gate.DISCONNECTED_BLOCKED, True)
    assert gate.handle(GateEvent.RECONNECTED) == []
    assert (gate.state, gate.is_open) == (Gate.BLOCKED, False)


def test_unblocked_while_disconnected_reconnects_open() -> None:
    gate = FlowGate(Gate.DISCONNECTED_BLOCKED)
    assert gate.handle(GateEvent.UNBLOCKED) == [ConnectionUnblocked()]
    assert gate.handle(GateEvent.UNBLOCKED) == []
    gate.handle(GateEvent.RECONNECTED)
    assert gate.is_open


def test_a_loss_while_disconnected_and_blocked_forgets_the_block() -> None:
    gate = FlowGate(Gate.DISCONNECTED_BLOCKED)
    assert gate.handle(GateEvent.CONNECTION_LOST) == [ConnectionUnblocked()]
    gate.handle(GateEvent.RECONNECTED)
    assert gate.is_open
