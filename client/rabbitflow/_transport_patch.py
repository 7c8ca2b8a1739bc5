"""Every place the SDK reaches into pika's internals, in one module.

pika's public API costs too much on the publish path, so the transports use
two of its private attributes, checked here and tested against the pika
versions ``pyproject.toml`` allows (``tests/client/test_transport_patch.py``):

* ``Connection._output_marshaled_frames`` and ``Connection._body_max_length``
  (``marshaled_output``): the publish path hands pika frames it encoded
  itself (``_transport_frames``);
* ``connection._transport._produce`` and ``._tx_buffers``
  (``coalesce_writes``, the sync transport only): pika writes each queued
  frame with its own ``send()``; the patch joins them first.

Each returns without effect when pika's internals are not as expected, and
the transports then use pika's public API.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

__all__ = ["coalesce_writes", "marshaled_output"]


def marshaled_output(connection: Any) -> tuple[Callable[[bytes], None], int] | None:
    """(write encoded frames, largest body frame payload) of a pika
    connection, or None when pika's internals are not as expected."""
    output = getattr(connection, "_output_marshaled_frames", None)
    body_max = getattr(connection, "_body_max_length", None)
    if output is None or not isinstance(body_max, int) or body_max <= 0:
        return None
    return (lambda data: output([data])), body_max


def coalesce_writes(connection: Any) -> bool:
    """Make pika send its queued frames with one ``send()`` per batch.

    pika writes each frame (three per published message) with its own
    syscall; each releases the GIL, which the application's sending thread
    then takes, so the I/O thread crawls.  Joining the queued chunks first
    keeps the bytes and their order and cuts the syscalls to one per batch.
    Returns whether the patch is in place (False: pika's internals are not
    as expected, and nothing was changed).
    """
    transport: Any = getattr(connection, "_transport", None)
    produce = getattr(transport, "_produce", None)
    buffers = getattr(transport, "_tx_buffers", None)
    if produce is None or not isinstance(buffers, collections.deque):
        return False

    def produce_joined() -> None:
        if len(buffers) > 1:
            joined = b"".join(buffers)
            buffers.clear()
            buffers.append(joined)
        produce()

    transport._produce = produce_joined
    return True
