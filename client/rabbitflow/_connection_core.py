"""What the sync and the asyncio connection share, whatever drives them:
the reconnection policy, the listener that tags a transport's events with
its generation, the error when recovery gives up, and carrying out the
consumer flow machine's actions on a channel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import tenacity

from ._consumer_flow import Ack, FlowAction, ProbeQueue, SetPrefetch, StartConsuming, StopConsuming
from ._endpoints import redact
from ._exceptions import ConnectionLostError, JMSException
from ._properties import ClientConfig

__all__ = ["FlowChannel", "TransportEvents", "carry_out", "recovery_failed", "retry_policy"]


def retry_policy(config: ClientConfig) -> dict[str, Any]:
    """The reconnection retry policy's tenacity arguments, from configuration.

    Up to ``rabbitflow.reconnect_attempts`` attempts within
    ``rabbitflow.reconnect_timeout`` ms, exponential backoff with jitter from
    ``rabbitflow.reconnect_initial_delay`` to ``rabbitflow.reconnect_max_delay``.
    """
    return {
        "stop": (
            tenacity.stop_after_attempt(max(config.reconnect_attempts, 1))
            | tenacity.stop_after_delay(config.reconnect_timeout_ms / 1000)
        ),
        "wait": tenacity.wait_exponential(
            multiplier=config.reconnect_initial_delay_ms / 1000,
            max=config.reconnect_max_delay_ms / 1000,
        )
        + tenacity.wait_random(0, config.reconnect_initial_delay_ms / 1000),
        "retry": tenacity.retry_if_exception_type(JMSException),
        "reraise": True,
    }


def recovery_failed(urls: Sequence[str], attempts: int, cause: JMSException) -> ConnectionLostError:
    """The error every waiting and later call gets once recovery gave up."""
    error = ConnectionLostError(
        f"connection to {', '.join(redact(u) for u in urls)} lost; recovery gave up after "
        f"{attempts} attempt(s): {cause}"
    )
    error.__cause__ = cause
    return error


class TransportEvents:
    """The listener of one transport: tags its events with the transport's
    generation, so that the connection ignores those of a transport it
    replaced."""

    def __init__(
        self,
        generation: int,
        *,
        blocked: Callable[[int, str], None],
        unblocked: Callable[[int], None],
        lost: Callable[[int, ConnectionLostError], None],
    ) -> None:
        self._generation = generation
        self._blocked = blocked
        self._unblocked = unblocked
        self._lost = lost

    def on_blocked(self, reason: str) -> None:
        """connection.blocked."""
        self._blocked(self._generation, reason)

    def on_unblocked(self) -> None:
        """connection.unblocked."""
        self._unblocked(self._generation)

    def on_lost(self, error: ConnectionLostError) -> None:
        """The transport died."""
        self._lost(self._generation, error)


class FlowChannel(Protocol):
    """The channel operations consumer flow needs (both drivers' channels)."""

    def qos_nowait(self, prefetch_count: int, on_ok: Callable[[], None] | None = None) -> None:
        """basic.qos global=true without waiting; ``on_ok()`` at its qos-ok."""

    def basic_consume_nowait(self, queue: str) -> None:
        """basic.consume without waiting."""

    def basic_cancel_nowait(self) -> None:
        """basic.cancel of the consumer started above."""

    def queue_depth_nowait(self, queue: str, on_depth: Callable[[int], None]) -> None:
        """Passive queue.declare; ``on_depth(message_count)`` when it answers."""

    def ack(self, tag: int, *, multiple: bool) -> None:
        """basic.ack."""


def carry_out(
    action: FlowAction,
    channel: FlowChannel,
    queue: str,
    on_depth: Callable[[int], None],
    on_lowered: Callable[[], None],
) -> None:
    """Send what one consumer flow action asks for on the consumer's channel
    (``on_lowered()`` when a prefetch that takes credit back is confirmed)."""
    if isinstance(action, SetPrefetch):
        channel.qos_nowait(action.count, on_lowered if action.confirm else None)
    elif isinstance(action, StartConsuming):
        channel.basic_consume_nowait(queue)
    elif isinstance(action, StopConsuming):
        channel.basic_cancel_nowait()
    elif isinstance(action, ProbeQueue):
        channel.queue_depth_nowait(queue, on_depth)
    elif isinstance(action, Ack):
        channel.ack(action.tag, multiple=True)
