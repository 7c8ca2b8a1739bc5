"""The CSRF and DNS-rebinding requests against a real gateway's admin API."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.broker.conftest import RunningGateway, with_own_store


@pytest.fixture
def gateway(gateway_factory: Callable[..., RunningGateway], tmp_path: Path) -> RunningGateway:
    """These tests assert on every stop the gateway holds (see with_own_store)."""
    return with_own_store(gateway_factory, tmp_path)


def _raw(gateway: RunningGateway, method: str, path: str, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", gateway.admin_port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(b"")
        return connection.getresponse().status
    finally:
        connection.close()


def test_cross_origin_text_plain_stop_gets_403_and_stops_nothing(gateway: RunningGateway) -> None:
    status = _raw(
        gateway,
        "POST",
        "/api/producers/stop",
        {
            "Host": "attacker.example",
            "Origin": "http://attacker.example",
            "Content-Type": "text/plain",
            "Content-Length": "0",
        },
    )
    _, store = gateway.http("GET", "/api/store")

    assert status == 403
    assert store["stops"] == []


def test_rebound_host_cannot_read_the_api(gateway: RunningGateway) -> None:
    status = _raw(gateway, "GET", "/api/queues", {"Host": f"attacker.example:{gateway.admin_port}"})

    assert status == 403


def test_same_origin_json_stop_and_start_work(gateway: RunningGateway) -> None:
    body = json.dumps({"vhost": "/", "queue": "rf-forgery-check"}).encode()
    host = f"127.0.0.1:{gateway.admin_port}"
    headers = {
        "Host": host,
        "Origin": f"http://{host}",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    }
    connection = http.client.HTTPConnection("127.0.0.1", gateway.admin_port, timeout=10)
    try:
        connection.request("POST", "/api/producers/stop", body=body, headers=headers)
        stopped = connection.getresponse()
        stopped.read()
        connection.request("POST", "/api/producers/start", body=body, headers=headers)
        started = connection.getresponse()
        answer = json.loads(started.read())
    finally:
        connection.close()

    assert (stopped.status, started.status) == (200, 200)
    assert answer["stops"] == []
