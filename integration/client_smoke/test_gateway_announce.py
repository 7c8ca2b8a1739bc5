"""The gateway says who it is in Connection.Start; the SDK notes, once, a
connection that goes straight to RabbitMQ instead."""

from __future__ import annotations

import logging
import time

import pika
import pika.exceptions
import pytest

import rabbitflow
from integration.conftest import Broker
from rabbitflow import _transport_base
from rabbitflow._transport_base import GATEWAY_PROPERTY

NOTE = "Connected straight to RabbitMQ"


def _connect(url: str) -> pika.BlockingConnection:
    """A connection, once the gateway has its first routing snapshot (until
    then it answers 320 at once)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _server_properties(url: str) -> dict[str, object]:
    connection = _connect(url)
    try:
        properties = connection._impl.server_properties
        assert isinstance(properties, dict)
        return properties
    finally:
        connection.close()


def test_the_gateway_announces_itself_and_rabbitmq_does_not(
    gateway_url: str, broker: Broker
) -> None:
    through = _server_properties(gateway_url)
    direct = _server_properties(broker.url)

    assert str(through[GATEWAY_PROPERTY]).startswith("rabbitflow-broker ")
    assert through["product"] == direct["product"]  # RabbitMQ's own properties stay
    assert GATEWAY_PROPERTY not in direct


def test_the_sdk_notes_a_direct_connection_once_and_a_gateway_never(
    gateway_url: str,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _connect(gateway_url).close()  # the gateway is ready
    monkeypatch.setattr(_transport_base, "_direct_noted", set())
    caplog.set_level(logging.INFO, logger="rabbitflow.client")

    for url in (gateway_url, broker.url, broker.url):
        with rabbitflow.ConnectionFactory(url).create_connection():
            pass

    notes = [r for r in caplog.records if r.getMessage().startswith(NOTE)]
    assert len(notes) == 1
    assert notes[0].levelno == logging.INFO
    assert f"{broker.host}:{broker.port}" in notes[0].getMessage()
