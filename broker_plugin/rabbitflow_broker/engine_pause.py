"""Flow control across a connection's channels, as functions of an engine.

The back-pressure allowance is per connection (:class:`~rabbitflow_broker.engine_flow.Allowance`):
publishes on flowed channels spend it, and once it is spent the engine stops
parsing after the publish that spent it and pauses reading the client until
the allowance is renewed (every channel free again) or the pause ends.  A
channel still publishing past the enforcement timeout is closed; a
connection that ignores flow again soon after such a close is closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rabbitflow_broker import amqp
from rabbitflow_broker.engine_flow import REPEAT_OFFENCE_S, Verdict

if TYPE_CHECKING:
    from rabbitflow_broker.engine import Engine
    from rabbitflow_broker.engine_channel import Channel

__all__ = [
    "counted_while_flowed",
    "flow_ignored",
    "pause_until",
    "refresh_channels",
    "resume_if_allowed",
]


def refresh_channels(engine: Engine) -> None:
    hub = engine.hub
    blocked = engine.route_blocked = hub.route_blocker(engine.vhost)
    vhost_blocked = hub.vhost_blocked(engine.vhost)
    for channel in list(engine.channels.values()):
        channel.refresh(blocked, vhost_blocked)
    if not any(channel.blockers for channel in engine.channels.values()):
        engine.allowance.renew()


def counted_while_flowed(engine: Engine, number: int, size: int) -> None:
    """A publish on a flowed channel: past the connection's allowance, stop
    parsing after it and pause reads."""
    if engine.allowance.count(size):
        until = pause_until(engine)
        if until is not None and until > engine.now:
            engine._stop_after = number
            if not engine._flow_paused:
                engine._flow_paused = True
                if engine._blocked_capable:
                    engine.send_client(0, amqp.connection_blocked("flow control"))


def pause_until(engine: Engine) -> float | None:
    return engine.allowance.pause_until(
        c.flowed_at
        for c in engine.channels.values()
        if c.blockers and c.flowed_at is not None and not c.closed_by_gateway
    )


def resume_if_allowed(engine: Engine) -> None:
    if not engine._flow_paused:
        if engine._client.pending and engine._upstream_ready:
            engine.parse_client(b"")
        return
    until = pause_until(engine)
    if until is not None and engine.allowance.spent and until > engine.now:
        return
    engine._flow_paused = False
    if engine._blocked_capable:
        engine.send_client(0, amqp.CONNECTION_UNBLOCKED_FRAME)
    engine.parse_client(b"")


def flow_ignored(engine: Engine, channel: Channel) -> bool:
    """True (and the channel or connection closed) when ``channel`` publishes
    past its enforcement timeout."""
    if not channel.blockers:
        return False
    verdict = engine.allowance.judge(engine.now, channel.flowed_at)
    if verdict is Verdict.FORWARD:
        return False
    engine.emit(channel.event_ignored())
    if verdict is Verdict.CLOSE_CONNECTION:
        engine.close_connection(
            amqp.PRECONDITION_FAILED,
            f"flow control ignored again within {REPEAT_OFFENCE_S:.0f} s of a channel close",
        )
        return True
    timeout = engine.settings.flow_enforcement_timeout or 0.0
    channel.close(
        amqp.PRECONDITION_FAILED,
        f"flow control ignored: still publishing {timeout * 1000:.0f} ms after "
        "Channel.Flow(active=false)",
        amqp.BASIC_PUBLISH,
    )
    return True
