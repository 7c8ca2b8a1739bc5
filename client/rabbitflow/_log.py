"""Client logging: structlog over the stdlib logger ``rabbitflow.client``.

The library never configures logging or structlog globally.  Records reach
``logging.getLogger("rabbitflow.client")`` with the event text as the record
message and the structured fields as record attributes (``extra``).
``json_formatter()`` is the documented recipe for JSON lines.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import structlog
from structlog.typing import EventDict

__all__ = ["LOGGER_NAME", "get_logger", "json_formatter"]

LOGGER_NAME = "rabbitflow.client"


def get_logger() -> Any:
    """A structlog logger writing to the stdlib logger ``rabbitflow.client``."""
    return structlog.wrap_logger(
        logging.getLogger(LOGGER_NAME),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.render_to_log_kwargs,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def _timestamp_ms(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    record = event_dict.get("_record")
    created = record.created if isinstance(record, logging.LogRecord) else None
    moment = datetime.fromtimestamp(created, UTC) if created is not None else datetime.now(UTC)
    event_dict["timestamp"] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return event_dict


def json_formatter() -> logging.Formatter:
    """A ``logging.Formatter`` that renders records as one JSON object per line.

    Keys: ``timestamp`` (ISO-8601 UTC, milliseconds, ``Z``), ``level``,
    ``logger``, ``event`` (the message) and every ``extra`` field (for flow
    records: ``flow_event``, ``producer``, ``destination``, ``capacity``,
    ``waited_ms``).  Attach it to a handler; nothing global is configured.
    """
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.ExtraAdder(),
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            _timestamp_ms,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
    )
