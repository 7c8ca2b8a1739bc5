"""The pika internals the SDK relies on (``rabbitflow._transport_patch``),
checked against the installed pika, whose version must be one that
``pyproject.toml`` allows.  A real connection to RabbitMQ checks them too:
``integration/client/test_transport_patch.py``."""

from __future__ import annotations

import collections
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import pika
import pika.connection
from packaging.requirements import Requirement
from packaging.version import Version
from pika.adapters.utils import io_services_utils

from rabbitflow._transport_patch import coalesce_writes, marshaled_output

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pika_requirement() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    (spec,) = [r for r in project["dependencies"] if Requirement(r).name == "pika"]
    return Requirement(spec)


def test_the_installed_pika_is_one_pyproject_allows_and_below_2() -> None:
    requirement = _pika_requirement()
    assert Version(pika.__version__) in requirement.specifier
    # The patch is written for pika 1.x: a new major version must be
    # looked at before it is allowed.
    assert not requirement.specifier.contains("2.0")


def test_pika_has_the_internals_the_patch_uses() -> None:
    base = io_services_utils._AsyncTransportBase
    assert callable(base._produce)
    init = inspect.getsource(base.__init__)
    assert re.search(r"self\._tx_buffers\b[^=\n]*= collections\.deque\(\)", init)
    connection = pika.connection.Connection
    assert callable(connection._output_marshaled_frames)
    assert "self._body_max_length = " in inspect.getsource(connection)


class _Transport:
    def __init__(self) -> None:
        self._tx_buffers: collections.deque[bytes] = collections.deque()
        self.produced: list[list[bytes]] = []

    def _produce(self) -> None:
        self.produced.append(list(self._tx_buffers))
        self._tx_buffers.clear()


class _Connection:
    def __init__(self) -> None:
        self._transport = _Transport()
        self._body_max_length = 131064
        self.frames: list[list[bytes]] = []

    def _output_marshaled_frames(self, frames: list[bytes]) -> None:
        self.frames.append(frames)


def test_coalesced_writes_keep_the_bytes_and_their_order_in_one_send() -> None:
    connection = _Connection()
    assert coalesce_writes(connection)
    transport: Any = connection._transport
    transport._tx_buffers.extend([b"ab", b"c", b"def"])
    transport._produce()
    assert transport.produced == [[b"abcdef"]]


def test_marshaled_output_writes_through_pika_with_its_body_frame_size() -> None:
    connection = _Connection()
    output = marshaled_output(connection)
    assert output is not None
    write, body_max = output
    write(b"frames")
    assert connection.frames == [[b"frames"]]
    assert body_max == 131064


def test_unexpected_internals_leave_pika_alone() -> None:
    assert not coalesce_writes(object())
    assert marshaled_output(object()) is None
    broken = _Connection()
    broken._body_max_length = 0
    assert marshaled_output(broken) is None
