"""Fixtures for the gateway-operations tests: the in-process gateway of
``integration/broker`` plus a fresh virtual host per test.

A fresh vhost keeps the store quota tests away from the persistent bytes
that tests running in parallel leave in ``/``.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from integration.broker.conftest import (  # noqa: F401  (fixtures re-exported)
    RunningGateway,
    gateway,
    gateway_factory,
    wait_for,
)
from integration.conftest import Broker

__all__ = ["RunningGateway", "management", "wait_for"]


def management(broker: Broker, method: str, path: str, body: object | None = None) -> object:
    """Call the shared node's management API as guest; raises on an error status."""
    base = (broker.management_url or "http://127.0.0.1:15672").rstrip("/")
    token = base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


@pytest.fixture
def fresh_vhost(broker: Broker) -> Iterator[str]:
    """A new vhost with full permissions for guest, deleted afterwards."""
    name = f"rf-ops-{uuid.uuid4().hex[:10]}"
    quoted = quote(name, safe="")
    management(broker, "PUT", f"/api/vhosts/{quoted}", {})
    management(
        broker,
        "PUT",
        f"/api/permissions/{quoted}/guest",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    yield name
    try:
        management(broker, "DELETE", f"/api/vhosts/{quoted}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
