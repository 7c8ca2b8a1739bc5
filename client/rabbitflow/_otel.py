"""OpenTelemetry spans for sends and receives (optional: ``rabbitflow[otel]``).

The SDK uses the global tracer provider the application configured (the
library never configures one).  A producer or consumer looks its tracer up
once, when it is created (``find_tracer()``); without ``opentelemetry-api``
installed, or while no provider is configured then, it has no tracer and a
send or receive costs one check.  Otherwise:

* a producer span ``send <destination>`` per ``send()`` (kind PRODUCER),
  with the messaging semantic conventions ``messaging.system=rabbitmq``,
  ``messaging.destination.name``, ``messaging.message.id``,
  ``messaging.operation.type=send``; when flow control held the send, an
  event ``flow_control.blocked`` (with the reason) at the moment it was
  held and the attribute ``rabbitflow.flow_control.wait_ms``;
* the span's context goes into the message's ``traceparent`` (and
  ``tracestate``) property, so it travels in the AMQP headers;
* a consumer span ``receive <destination>`` (kind CONSUMER) per message
  handed to the application, linked to the producer's span.
"""

from __future__ import annotations

from typing import Any

from ._destination import Destination
from ._message import Message

__all__ = ["blocked", "end_send", "find_tracer", "receive_span", "start_send", "waited"]

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    _ENABLED = True
except ImportError:  # pragma: no cover - the extra is not installed
    _ENABLED = False

_SCOPE = "rabbitflow"
_WAIT_ATTRIBUTE = "rabbitflow.flow_control.wait_ms"


_cached: tuple[Any, Any] | None = None  # (provider, its tracer)


def find_tracer() -> Any:
    """The tracer of the application's provider; None without the extra or
    while no provider is configured.  Looked up once per producer or
    consumer, never per message: while no provider is set, OpenTelemetry
    reads the environment each time it is asked for one."""
    global _cached
    if not _ENABLED:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(_SCOPE))
    return cached[1]


def start_send(tracer: Any, message: Message, target: Destination) -> Any:
    """Start the producer span of one send with ``tracer`` (from ``find_tracer()``,
    not None) and put its context in the message's properties; None when the
    span does not record."""
    span = tracer.start_span(
        f"send {target.name}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": target.name,
            "messaging.message.id": message.message_id or "",
            "messaging.rabbitmq.destination.routing_key": target.routing_key,
        },
    )
    if not span.is_recording():  # no tracer provider configured: cost nothing more
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    for key in ("traceparent", "tracestate"):
        if key in carrier:
            message.set_property(key, carrier[key])
    return span


def blocked(span: Any, reason: str) -> None:
    """Flow control started holding the send."""
    if span is not None:
        span.add_event("flow_control.blocked", {"rabbitflow.flow_control.reason": reason})


def waited(span: Any, seconds: float) -> None:
    """Record how long the send waited under flow control."""
    if span is not None:
        span.set_attribute(_WAIT_ATTRIBUTE, round(seconds * 1000, 3))


def end_send(span: Any, error: BaseException | None, waited_s: float = 0.0) -> None:
    """End the producer span (with the error when the send failed)."""
    if span is None:
        return
    if error is None:
        span.set_attribute(_WAIT_ATTRIBUTE, round(waited_s * 1000, 3))
    elif isinstance(error, Exception):
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    else:  # cancelled
        span.set_attribute("rabbitflow.send.cancelled", True)
    span.end()


def receive_span(tracer: Any, message: Message, destination: Destination) -> None:
    """Record with ``tracer`` (from ``find_tracer()``, not None) the consumer span
    of a message handed to the application, linked to the span of the send
    that produced it."""
    parent = message.get_property("traceparent")
    links = []
    if isinstance(parent, str):
        carrier = {"traceparent": parent}
        state = message.get_property("tracestate")
        if isinstance(state, str):
            carrier["tracestate"] = state
        context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    span = tracer.start_span(
        f"receive {destination.name}",
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "receive",
            "messaging.operation.name": "receive",
            "messaging.destination.name": destination.name,
            "messaging.message.id": message.message_id or "",
        },
    )
    span.end()
