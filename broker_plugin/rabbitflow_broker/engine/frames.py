"""AMQP 0-9-1 framing names, kept importable from here.

The wire's constants live in :mod:`~rabbitflow_broker.engine.amqp` (frame types,
the protocol header, reply codes) and the protocol error in
:mod:`~rabbitflow_broker.engine.errors`; this module re-exports them for code that
imports them from ``rabbitflow_broker.engine.frames``.
"""

from __future__ import annotations

from rabbitflow_broker.engine.amqp import (
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from rabbitflow_broker.engine.errors import FrameError

__all__ = [
    "COMMAND_INVALID",
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_ERROR",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "NOT_ALLOWED",
    "PRECONDITION_FAILED",
    "PROTOCOL_HEADER",
    "SYNTAX_ERROR",
    "UNEXPECTED_FRAME",
    "FrameError",
]
