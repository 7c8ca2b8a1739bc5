"""Prometheus metrics of one gateway (``GET /metrics``).

:class:`GatewayCollector` is a prometheus-client custom collector that
reads the gateway's snapshots at scrape time; :func:`render` serialises
them in the text exposition format (0.0.4), and :func:`negotiate` in
OpenMetrics when the scraper's ``Accept`` header asks for it, from a
registry of our own, so nothing is ever added to (or read from)
prometheus-client's global registry.  The registry also holds
prometheus-client's process (``process_*``: CPU, memory, file
descriptors), garbage collector and platform (``python_*``) collectors.

Every name passes ``promtool check metrics`` (promlint).

Families (labels ``vhost``, ``queue`` unless noted):

===========================================  =======  ===========================================
``rabbitflow_queue_messages``                gauge    depth: enqueued and not yet acknowledged
``rabbitflow_queue_bytes``                   gauge    body bytes of those messages
``rabbitflow_queue_flow_stop_messages``      gauge    threshold (0 = not set); also
                                                      ``_resume_messages``, ``_stop_size_bytes``,
                                                      ``_resume_size_bytes``
``rabbitflow_queue_flow_stopped``            gauge    1 while the queue's flow is ON
``rabbitflow_queue_flow_stops_total``        counter  OFF→ON transitions (``flowStoppedCount``)
``rabbitflow_queue_flow_stopped_seconds``    counter  time spent ON (from the threshold
``_total``                                            machine's transitions)
``rabbitflow_store_size_bytes``              gauge    per ``vhost``: store size
``rabbitflow_store_overfull``                gauge    per ``vhost``: 1 while over quota
``rabbitflow_store_overfull_size_bytes``     gauge    per ``vhost``: quota (0 = off); also
                                                      ``_underfull_size_bytes``
``rabbitflow_producers_stopped``             gauge    administrator stops in force
``rabbitflow_blocked_channels``              gauge    per ``vhost``: channels sent Flow(false)
``rabbitflow_held_confirms``                 gauge    publisher confirms currently held
``rabbitflow_build_info``                    gauge    1, labels ``version``, ``engine``
                                                      (``mypyc`` or ``pure``), ``python``
===========================================  =======  ===========================================

Deprecated: ``rabbitflow_queue_flow_stop_count`` and
``rabbitflow_queue_flow_resume_count`` (the ``_count`` suffix is reserved
for summaries and histograms) are still served, untyped, with the values of
``..._flow_stop_messages`` / ``..._flow_resume_messages``; they will be
removed in the next release.

The counter of flow stops is named ``..._flow_stops_total`` rather than
``..._flow_stopped_total`` because a counter family ``flow_stopped`` would
collide with the 0/1 gauge of the same name.  Time spent stopped is read
from the queue snapshot's ``flow_stopped_seconds`` when the gateway
provides it; it is never estimated here by sampling.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from rabbitflow_broker import accel

if TYPE_CHECKING:
    from rabbitflow_broker.hub.gateway import Gateway

__all__ = ["CONTENT_TYPE", "GatewayCollector", "metrics_registry", "negotiate", "render"]

#: The ``Content-Type`` of :func:`render`'s output.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_QUEUE = ["vhost", "queue"]


class GatewayCollector(Collector):
    """Reads a :class:`~rabbitflow_broker.hub.gateway.Gateway` at each scrape.

    Must be collected on the gateway's event loop thread (the admin API's
    handlers are), since the gateway is not thread-safe.
    """

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        """Yield every family; see the module docstring."""
        yield from self._queue_metrics()
        yield from self._store_metrics()
        yield from self._channel_metrics()
        yield _build_info()

    def _queue_metrics(self) -> Iterator[Metric]:
        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=_QUEUE)

        messages = gauge("rabbitflow_queue_messages", "Messages enqueued and not yet acknowledged")
        size = gauge("rabbitflow_queue_bytes", "Body bytes of the messages counted in depth")
        stop_count = gauge(
            "rabbitflow_queue_flow_stop_messages", "Flow stop count in messages (0 = not set)"
        )
        resume_count = gauge(
            "rabbitflow_queue_flow_resume_messages", "Flow resume count in messages (0 = not set)"
        )
        old_stop_count = UnknownMetricFamily(
            "rabbitflow_queue_flow_stop_count",
            "Deprecated: use rabbitflow_queue_flow_stop_messages",
            labels=_QUEUE,
        )
        old_resume_count = UnknownMetricFamily(
            "rabbitflow_queue_flow_resume_count",
            "Deprecated: use rabbitflow_queue_flow_resume_messages",
            labels=_QUEUE,
        )
        stop_size = gauge(
            "rabbitflow_queue_flow_stop_size_bytes", "Flow stop size in bytes (0 = not set)"
        )
        resume_size = gauge(
            "rabbitflow_queue_flow_resume_size_bytes", "Flow resume size in bytes (0 = not set)"
        )
        stopped = gauge("rabbitflow_queue_flow_stopped", "1 while the queue's flow is ON")
        stops = CounterMetricFamily(
            "rabbitflow_queue_flow_stops",
            "Times the queue's flow went OFF to ON (flowStoppedCount)",
            labels=_QUEUE,
        )
        seconds = CounterMetricFamily(
            "rabbitflow_queue_flow_stopped_seconds",
            "Seconds the queue's flow has spent ON",
            labels=_QUEUE,
        )
        have_seconds = False
        for snap in self._gateway.snapshots():
            labels = [snap.vhost, snap.name]
            t = snap.thresholds
            messages.add_metric(labels, snap.messages)
            size.add_metric(labels, snap.bytes)
            stop_count.add_metric(labels, t.stop_count)
            resume_count.add_metric(labels, t.resume_count)
            old_stop_count.add_metric(labels, t.stop_count)
            old_resume_count.add_metric(labels, t.resume_count)
            stop_size.add_metric(labels, t.stop_size)
            resume_size.add_metric(labels, t.resume_size)
            stopped.add_metric(labels, 1 if snap.flow_stopped else 0)
            stops.add_metric(labels, snap.flow_stopped_count)
            # Forward-compatible: the flow machine does not track time ON yet.
            spent = getattr(snap, "flow_stopped_seconds", None)
            if isinstance(spent, int | float) and not isinstance(spent, bool):
                seconds.add_metric(labels, float(spent))
                have_seconds = True
        yield from (messages, size, stop_count, resume_count, stop_size, resume_size)
        yield from (stopped, stops)
        if have_seconds:
            yield seconds
        yield from (old_stop_count, old_resume_count)

    def _store_metrics(self) -> Iterator[Metric]:
        labels = ["vhost"]
        size = GaugeMetricFamily(
            "rabbitflow_store_size_bytes", "Store size of the vhost in bytes", labels=labels
        )
        overfull = GaugeMetricFamily(
            "rabbitflow_store_overfull", "1 while the vhost's store is over quota", labels=labels
        )
        over_size = GaugeMetricFamily(
            "rabbitflow_store_overfull_size_bytes",
            "Store size above which producers are blocked (0 = off)",
            labels=labels,
        )
        under_size = GaugeMetricFamily(
            "rabbitflow_store_underfull_size_bytes",
            "Store size below which producers resume (0 = off)",
            labels=labels,
        )
        for store in self._gateway.store_quotas.snapshots():
            size.add_metric([store.vhost], store.size)
            overfull.add_metric([store.vhost], 1 if store.overfull else 0)
            over_size.add_metric([store.vhost], store.overfull_size)
            under_size.add_metric([store.vhost], store.underfull_size)
        stops = GaugeMetricFamily(
            "rabbitflow_producers_stopped", "Administrator producer stops in force"
        )
        stops.add_metric([], len(self._gateway.admin_stops()))
        yield from (size, overfull, over_size, under_size, stops)

    def _channel_metrics(self) -> Iterator[Metric]:
        per_vhost = Counter(c.vhost for c in self._gateway.blocked_channels())
        blocked = GaugeMetricFamily(
            "rabbitflow_blocked_channels",
            "Client channels currently sent Channel.Flow(active=false)",
            labels=["vhost"],
        )
        for vhost, count in sorted(per_vhost.items()):
            blocked.add_metric([vhost], count)
        held = GaugeMetricFamily(
            "rabbitflow_held_confirms", "Publisher confirms the gateway is holding back"
        )
        held.add_metric([], self._gateway.held_confirms())
        yield from (blocked, held)


def _build_info() -> GaugeMetricFamily:
    from rabbitflow_broker.version import __version__

    info = GaugeMetricFamily(
        "rabbitflow_build_info",
        "The gateway's version, engine (mypyc or pure) and Python; always 1",
        labels=["version", "engine", "python"],
    )
    engine = "mypyc" if accel.status().startswith("compiled") else "pure"
    info.add_metric([__version__, engine, platform.python_version()], 1)
    return info


def metrics_registry(gateway: Gateway) -> CollectorRegistry:
    """A fresh registry with a :class:`GatewayCollector` for ``gateway`` and the
    process, garbage collector and platform collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(gateway))
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format (see :data:`CONTENT_TYPE`)."""
    return generate_latest(registry)


def negotiate(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The registry as the ``Accept`` header asks: OpenMetrics when it names
    ``application/openmetrics-text``, else the text format.  Returns the body
    and its ``Content-Type``."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
