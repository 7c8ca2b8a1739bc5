"""Queue maxima for the advice: ``--queue-limits`` documents read into rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_FLOW_STOP_THRESHOLD", "QueueLimitsError", "parse_queue_limits"]


class QueueLimitsError(ValueError):
    """The ``--queue-limits`` file is not a list of queues with maxima."""


def _first_int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value > 0:
            return value
    return None


#: The gateway's ``--default-flow-stop-threshold`` default (percent of a queue's maximum).
DEFAULT_FLOW_STOP_THRESHOLD = 80


def _derived_maximum(stop: Any, stop_pct: int) -> int | None:
    """The smallest maximum whose ``stop_pct`` percent is the default stop threshold ``stop``.

    The gateway sets a default stop at ``maximum * pct // 100``, so the
    maximum is at least ``ceil(stop * 100 / pct)``; the smallest is taken,
    which makes the advice's "stop + capacities fit the maximum" check no
    more lenient than with the real maximum.
    """
    value = _first_int(stop)
    if value is None:
        return None
    return -(-value * 100 // stop_pct)


def _gateway_limits(item: Mapping[str, Any], stop_pct: int) -> tuple[int | None, int | None]:
    """A gateway admin API queue's maxima: shown ones, else derived from default thresholds."""
    max_count = _first_int(item.get("maxCount"))
    max_size = _first_int(item.get("maxSize"))
    if item.get("source") == "default":
        # The gateway derived these thresholds from the queue's maximum.
        if max_count is None:
            max_count = _derived_maximum(item.get("flowStopCount"), stop_pct)
        if max_size is None:
            max_size = _derived_maximum(item.get("flowStopSize"), stop_pct)
    return max_count, max_size


def _lowest(*values: Any) -> int | None:
    present = [v for v in (_first_int(value) for value in values) if v is not None]
    return min(present) if present else None


def parse_queue_limits(
    document: Any, *, default_stop_pct: int = DEFAULT_FLOW_STOP_THRESHOLD
) -> list[tuple[str, str, int | None, int | None]]:
    """Queue maxima from a ``--queue-limits`` document.

    Accepts a JSON list of queue objects (or ``{"queues": [...]}``) in any
    of three forms:

    * our own ``{"vhost", "queue", "max_count", "max_size"}``;
    * a gateway admin API ``GET /api/queues`` snapshot (recognised by its
      ``flowStopCount``): ``maxCount``/``maxSize`` when shown, else, for a
      queue whose thresholds are the gateway's defaults (``"source":
      "default"``), the maximum those defaults were derived from at
      ``default_stop_pct`` percent (the gateway's
      ``--default-flow-stop-threshold``); a queue with thresholds of its own
      shows no maximum and gets nulls;
    * a RabbitMQ management ``/api/queues`` snapshot: the lowest of
      ``arguments`` ``x-max-length`` (``x-max-length-bytes``), Qpid's
      ``qpid.max_count`` (``qpid.max_size``) and the
      ``effective_policy_definition`` ``max-length`` (``max-length-bytes``).

    Queues with neither maximum are kept with nulls.

    Raises:
        QueueLimitsError: not a list of objects, an object without a name, or
            ``default_stop_pct`` not in 1..100.
    """
    if not 0 < default_stop_pct <= 100:
        raise QueueLimitsError(
            f"default flow stop threshold must be 1..100 percent, got {default_stop_pct}"
        )
    if isinstance(document, Mapping) and "queues" in document:
        document = document["queues"]
    if not isinstance(document, list):
        raise QueueLimitsError("queue limits must be a JSON list of queue objects")
    rows: list[tuple[str, str, int | None, int | None]] = []
    for index, item in enumerate(document):
        if not isinstance(item, Mapping):
            raise QueueLimitsError(f"queue limits entry {index} is not an object")
        name = item.get("queue", item.get("name"))
        if not isinstance(name, str) or not name:
            raise QueueLimitsError(f"queue limits entry {index} has no queue name")
        vhost = item.get("vhost") or "/"
        if "flowStopCount" in item:
            max_count, max_size = _gateway_limits(item, default_stop_pct)
            rows.append((str(vhost), name, max_count, max_size))
            continue
        rows.append((str(vhost), name, *_own_or_management_limits(item)))
    return rows


def _own_or_management_limits(item: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Our own format's maxima, else a RabbitMQ management API queue's lowest ones."""
    args = item.get("arguments") or {}
    policy = item.get("effective_policy_definition") or {}
    max_count = _first_int(item.get("max_count"), item.get("max_length")) or _lowest(
        item.get("x-max-length"),
        args.get("x-max-length"),
        args.get("qpid.max_count"),
        policy.get("max-length"),
    )
    max_size = _first_int(item.get("max_size"), item.get("max_length_bytes")) or _lowest(
        item.get("x-max-length-bytes"),
        args.get("x-max-length-bytes"),
        args.get("qpid.max_size"),
        policy.get("max-length-bytes"),
    )
    return max_count, max_size
