"""Where runtime thresholds and administrator stops survive gateway restarts.

Two stores with one interface:

* :class:`RabbitMQThresholdStore` (default) keeps each queue's runtime
  thresholds in RabbitMQ itself, as a global runtime parameter named
  ``rabbitflow-thresholds:<vhost>:<queue>`` -- one per queue, so gateways
  sharing a RabbitMQ never overwrite each other's changes -- and each
  administrator stop as a parameter ``rabbitflow-stop:["<vhost>", "<queue>"]``
  (JSON ``null`` for "every");
* :class:`FileThresholdStore` (``--state-file``) keeps both in one JSON file,
  replaced atomically.

Both raise :class:`PersistenceError` when the store cannot be read or written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rabbitflow_broker.engine.depth import QueueKey
from rabbitflow_broker.engine.errors import OutsideError
from rabbitflow_broker.engine.flow import ThresholdError, Thresholds
from rabbitflow_broker.server.management import ManagementClient, ManagementError

__all__ = [
    "PARAMETER_PREFIX",
    "STOP_PREFIX",
    "AdminStop",
    "FileThresholdStore",
    "PersistenceError",
    "RabbitMQThresholdStore",
    "ThresholdStore",
]

PARAMETER_PREFIX = "rabbitflow-thresholds:"
STOP_PREFIX = "rabbitflow-stop:"

#: An administrator stop: (vhost or None for every vhost, queue or None for every queue).
AdminStop = tuple[str | None, str | None]


class PersistenceError(OutsideError):
    """Runtime thresholds could not be loaded or saved."""


class ThresholdStore(Protocol):
    """Keeps runtime thresholds across restarts."""

    async def load(self) -> dict[QueueKey, Thresholds]:
        """Every stored queue's thresholds."""

    async def save(self, key: QueueKey, thresholds: Thresholds | None) -> None:
        """Store (or, with None, forget) one queue's thresholds."""

    async def load_stops(self) -> list[AdminStop]:
        """Every stored administrator stop."""

    async def save_stop(self, stop: AdminStop, stopped: bool) -> None:
        """Store (``stopped``) or forget one administrator stop."""


def _record(key: QueueKey, thresholds: Thresholds) -> dict[str, Any]:
    return {"vhost": key[0], "queue": key[1], **thresholds.to_json()}


def _parse(record: Mapping[str, Any]) -> tuple[QueueKey, Thresholds]:
    try:
        key = (str(record["vhost"]), str(record["queue"]))
        thresholds = Thresholds(
            stop_count=record.get("flowStopCount", 0),
            resume_count=record.get("flowResumeCount", 0),
            stop_size=record.get("flowStopSize", 0),
            resume_size=record.get("flowResumeSize", 0),
        )
    except (KeyError, TypeError, ThresholdError) as exc:
        raise PersistenceError(f"bad stored thresholds {record!r}: {exc}") from exc
    return key, thresholds


def _stop_record(stop: AdminStop) -> dict[str, str | None]:
    return {"vhost": stop[0], "queue": stop[1]}


def _parse_stop(record: object) -> AdminStop:
    if not isinstance(record, Mapping):
        raise PersistenceError(f"bad stored stop {record!r}: not an object")
    vhost, queue = record.get("vhost"), record.get("queue")
    for value in (vhost, queue):
        if value is not None and not isinstance(value, str):
            raise PersistenceError(f"bad stored stop {record!r}: names must be strings or null")
    return vhost, queue


class RabbitMQThresholdStore:
    """Runtime thresholds as RabbitMQ global runtime parameters."""

    def __init__(self, management: ManagementClient) -> None:
        self._management = management

    @staticmethod
    def parameter_name(key: QueueKey) -> str:
        """The global parameter holding one queue's thresholds."""
        return f"{PARAMETER_PREFIX}{key[0]}:{key[1]}"

    async def load(self) -> dict[QueueKey, Thresholds]:
        """Raises: PersistenceError when RabbitMQ cannot be asked."""
        try:
            items = await self._management.global_parameters(PARAMETER_PREFIX)
        except ManagementError as exc:
            raise PersistenceError(str(exc)) from exc
        out: dict[QueueKey, Thresholds] = {}
        for item in items:
            value = item.get("value")
            if isinstance(value, Mapping):
                key, thresholds = _parse(value)
                out[key] = thresholds
        return out

    async def save(self, key: QueueKey, thresholds: Thresholds | None) -> None:
        """Raises: PersistenceError when RabbitMQ refuses or cannot be reached."""
        name = self.parameter_name(key)
        try:
            if thresholds is None:
                await self._management.delete_global_parameter(name)
            else:
                await self._management.put_global_parameter(name, _record(key, thresholds))
        except ManagementError as exc:
            raise PersistenceError(str(exc)) from exc

    @staticmethod
    def stop_parameter_name(stop: AdminStop) -> str:
        """The global parameter holding one administrator stop."""
        return STOP_PREFIX + json.dumps(list(stop))

    async def load_stops(self) -> list[AdminStop]:
        """Raises: PersistenceError when RabbitMQ cannot be asked."""
        try:
            items = await self._management.global_parameters(STOP_PREFIX)
        except ManagementError as exc:
            raise PersistenceError(str(exc)) from exc
        return [_parse_stop(item.get("value")) for item in items]

    async def save_stop(self, stop: AdminStop, stopped: bool) -> None:
        """Raises: PersistenceError when RabbitMQ refuses or cannot be reached."""
        name = self.stop_parameter_name(stop)
        try:
            if stopped:
                await self._management.put_global_parameter(name, _stop_record(stop))
            else:
                await self._management.delete_global_parameter(name)
        except ManagementError as exc:
            raise PersistenceError(str(exc)) from exc


class FileThresholdStore:
    """Runtime thresholds in a JSON file (``--state-file``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._cache: tuple[dict[QueueKey, Thresholds], list[AdminStop]] | None = None

    def _read(self) -> tuple[dict[QueueKey, Thresholds], list[AdminStop]]:
        if not self.path.exists():
            return {}, []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PersistenceError(f"cannot read {self.path}: {exc}") from exc
        if not isinstance(data, Mapping):
            return {}, []
        thresholds = dict(_parse(item) for item in data.get("thresholds", []))
        return thresholds, [_parse_stop(item) for item in data.get("stops", [])]

    def _state(self) -> tuple[dict[QueueKey, Thresholds], list[AdminStop]]:
        if self._cache is None:
            self._cache = self._read()
        return self._cache

    async def load(self) -> dict[QueueKey, Thresholds]:
        """Raises: PersistenceError for an unreadable or malformed file."""
        self._cache = self._read()
        return dict(self._cache[0])

    async def load_stops(self) -> list[AdminStop]:
        """Raises: PersistenceError for an unreadable or malformed file."""
        self._cache = self._read()
        return list(self._cache[1])

    async def save(self, key: QueueKey, thresholds: Thresholds | None) -> None:
        """Raises: PersistenceError when the file cannot be written."""
        cache, _stops = self._state()
        if thresholds is None:
            cache.pop(key, None)
        else:
            cache[key] = thresholds
        self._write()

    async def save_stop(self, stop: AdminStop, stopped: bool) -> None:
        """Raises: PersistenceError when the file cannot be written."""
        _thresholds, stops = self._state()
        if stop in stops:
            stops.remove(stop)
        if stopped:
            stops.append(stop)
        self._write()

    def _write(self) -> None:
        thresholds, stops = self._state()
        body = json.dumps(
            {
                "thresholds": [_record(k, t) for k, t in sorted(thresholds.items())],
                "stops": [_stop_record(stop) for stop in stops],
            },
            indent=2,
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise PersistenceError(f"cannot write {self.path}: {exc}") from exc
