"""Where runtime thresholds survive gateway restarts.

Two stores with one interface:

* :class:`RabbitMQThresholdStore` (default) keeps each queue's runtime
  thresholds in RabbitMQ itself, as a global runtime parameter named
  ``rabbitflow-thresholds:<vhost>:<queue>`` -- one per queue, so gateways
  sharing a RabbitMQ never overwrite each other's changes;
* :class:`FileThresholdStore` (``--state-file``) keeps them in one JSON file,
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

from rabbitflow_broker.depth import QueueKey
from rabbitflow_broker.flow import ThresholdError, Thresholds
from rabbitflow_broker.upstream import ManagementClient, ManagementError

__all__ = [
    "PARAMETER_PREFIX",
    "FileThresholdStore",
    "PersistenceError",
    "RabbitMQThresholdStore",
    "ThresholdStore",
]

PARAMETER_PREFIX = "rabbitflow-thresholds:"


class PersistenceError(Exception):
    """Runtime thresholds could not be loaded or saved."""


class ThresholdStore(Protocol):
    """Keeps runtime thresholds across restarts."""

    async def load(self) -> dict[QueueKey, Thresholds]:
        """Every stored queue's thresholds."""

    async def save(self, key: QueueKey, thresholds: Thresholds | None) -> None:
        """Store (or, with None, forget) one queue's thresholds."""


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


class FileThresholdStore:
    """Runtime thresholds in a JSON file (``--state-file``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._cache: dict[QueueKey, Thresholds] | None = None

    def _read(self) -> dict[QueueKey, Thresholds]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PersistenceError(f"cannot read {self.path}: {exc}") from exc
        items = data.get("thresholds", []) if isinstance(data, Mapping) else []
        return dict(_parse(item) for item in items)

    async def load(self) -> dict[QueueKey, Thresholds]:
        """Raises: PersistenceError for an unreadable or malformed file."""
        self._cache = self._read()
        return dict(self._cache)

    async def save(self, key: QueueKey, thresholds: Thresholds | None) -> None:
        """Raises: PersistenceError when the file cannot be written."""
        cache = self._cache if self._cache is not None else self._read()
        if thresholds is None:
            cache.pop(key, None)
        else:
            cache[key] = thresholds
        self._cache = cache
        body = json.dumps(
            {"thresholds": [_record(k, t) for k, t in sorted(cache.items())]}, indent=2
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise PersistenceError(f"cannot write {self.path}: {exc}") from exc
