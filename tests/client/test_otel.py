"""OpenTelemetry spans of sends and receives, recorded with the SDK's in-memory
exporter: a blocked send's span carries its flow-control wait, and the
consumer's span links to the producer's through the ``traceparent`` header."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import rabbitflow
from rabbitflow._flow import GateEvent

from .aio_fakes import Broker, fake_factory
from .fakes import make_harness

_EXPORTER = InMemorySpanExporter()


class _Switch:
    """Whether the tracer traces: only inside these tests, although the
    process-wide provider, once set, stays for every later test of the
    worker (which must not find ``traceparent`` in its messages)."""

    on = False


class _SwitchedTracer:
    def __init__(self, real: trace.Tracer) -> None:
        self._real, self._off = real, trace.NoOpTracer()

    def __getattr__(self, name: str) -> object:
        return getattr(self._real if _Switch.on else self._off, name)


class _SwitchedProvider(TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchedTracer(super().get_tracer(*args, **kwargs))  # type: ignore[return-value]


def _install_provider() -> None:
    # The global provider can be set once per process; every test shares it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = _SwitchedProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _install_provider()
    _EXPORTER.clear()
    _Switch.on = True
    yield _EXPORTER
    _Switch.on = False


def _setup() -> tuple[object, rabbitflow.Session, rabbitflow.MessageProducer]:
    harness = make_harness(
        {"qpid.flow_control_wait_failure": 10000, "qpid.flow_control_wait_notify_period": 1000}
    )
    harness.broker.queues["orders"] = {}
    session = harness.factory.create_connection().create_session()
    producer = session.create_producer(session.create_queue("orders"), capacity=1)
    return harness, session, producer


def _one(spans: InMemorySpanExporter, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans.get_finished_spans() if s.kind is kind]
    assert len(found) == 1, found
    return found[0]


def test_a_send_has_a_producer_span_with_the_messaging_attributes(
    spans: InMemorySpanExporter,
) -> None:
    _, session, producer = _setup()
    message = session.create_text_message("hi")
    producer.send(message)
    span = _one(spans, SpanKind.PRODUCER)
    assert span.name == "send orders"
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.destination.name"] == "orders"
    assert attributes["messaging.message.id"] == message.message_id
    assert attributes["rabbitflow.flow_control.wait_ms"] == 0
    assert [e.name for e in span.events] == []
    trace_id = f"{span.context.trace_id:032x}"
    assert str(message.get_property("traceparent")).split("-")[1] == trace_id


def test_a_blocked_send_carries_its_wait_as_an_attribute_and_an_event(
    spans: InMemorySpanExporter,
) -> None:
    harness, session, producer = _setup()
    producer.send(session.create_text_message("1"))
    producer._gate(GateEvent.FLOW_OFF)
    # The broker confirms "1" at once but lifts the flow only 2.5 s later
    # (the fake wait advances the clock by each wait's timeout).
    channel = harness.transport.channels[-1]  # type: ignore[attr-defined]
    channel.emit_ack(1)
    wait = harness.wait  # type: ignore[attr-defined]
    wait.during_wait = [lambda: None, lambda: None, lambda: producer._gate(GateEvent.FLOW_ON)]
    producer.send(session.create_text_message("2"))
    sends = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    blocked = sends[-1]
    waited_ms = dict(blocked.attributes or {})["rabbitflow.flow_control.wait_ms"]
    assert isinstance(waited_ms, float | int)
    assert 2000 <= waited_ms <= 4000
    assert [e.name for e in blocked.events] == ["flow_control.blocked"]
    assert dict(blocked.events[0].attributes or {})["rabbitflow.flow_control.reason"] == "flowed"


def test_a_failed_send_records_the_flow_control_timeout(spans: InMemorySpanExporter) -> None:
    _, session, producer = _setup()
    producer.send(session.create_text_message("1"))
    producer._gate(GateEvent.FLOW_OFF)
    with pytest.raises(rabbitflow.FlowControlTimeoutError):
        producer.send(session.create_text_message("2"))
    failed = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER][-1]
    assert not failed.status.is_ok
    assert any(e.name == "exception" for e in failed.events)


def test_the_consumer_span_links_to_the_producer_span(spans: InMemorySpanExporter) -> None:
    harness, session, producer = _setup()
    producer.send(session.create_text_message("traced"))
    published = harness.broker.published[-1]  # type: ignore[attr-defined]
    consumer = session.create_consumer(rabbitflow.Queue("orders"))
    session.connection.start()
    channel = harness.transport.channels[-1]  # type: ignore[attr-defined]
    channel.emit_deliver(1, published.body, properties=published.props)
    message = consumer.receive(1)
    assert message is not None
    send = _one(spans, SpanKind.PRODUCER)
    receive = _one(spans, SpanKind.CONSUMER)
    assert receive.name == "receive orders"
    assert [link.context.span_id for link in receive.links] == [send.context.span_id]
    assert [link.context.trace_id for link in receive.links] == [send.context.trace_id]


@pytest.mark.asyncio
async def test_an_aio_send_held_by_flow_control_carries_its_wait(
    spans: InMemorySpanExporter,
) -> None:
    broker = Broker(queues={"orders"})
    connection = await fake_factory(broker).create_connection()
    session = connection.create_session()
    producer = await session.create_producer(rabbitflow.Queue("orders"))
    channel = broker.transports[-1].channels[-1]
    channel.emit_flow(False)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, channel.emit_flow, True)
    message = session.create_text_message("held")
    await producer.send(message)
    span = _one(spans, SpanKind.PRODUCER)
    attributes = dict(span.attributes or {})
    assert attributes["messaging.message.id"] == message.message_id
    waited_ms = attributes["rabbitflow.flow_control.wait_ms"]
    assert isinstance(waited_ms, float | int)
    assert 250 <= waited_ms <= 5000
    assert [e.name for e in span.events] == ["flow_control.blocked"]
