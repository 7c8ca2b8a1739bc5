"""The web console in a real headless chromium (issue 4, point 5).

Chromium is driven over the DevTools Protocol (``_cdp.py``).  The console
is used as an operator would: thresholds are set with its form, the queue
is watched turning overfull and underfull while a producer runs, and its
per-queue stop/start buttons block and free a producer.  The screenshot
is kept in ``artifacts/console.png``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from integration.admin._cdp import Page, chromium_page, eventually
from integration.broker.conftest import RunningGateway

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser


class ConfirmingProducer(threading.Thread):
    """Publishes ``count`` numbered messages through the gateway, each waiting for its confirm."""

    def __init__(self, url: str, queue: str, count: int, first: int = 0) -> None:
        super().__init__(name=f"producer-{queue}", daemon=True)
        self.url, self.queue, self.count, self.first = url, queue, count, first
        self.confirmed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                for i in range(self.first, self.first + self.count):
                    channel.basic_publish("", self.queue, str(i).encode() + b"." * 100)
                    self.confirmed += 1
            finally:
                connection.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def drain(url: str, queue: str, expected: int, timeout: float) -> list[int]:
    """Get and ack ``expected`` messages through the gateway; return their numbers."""
    received: list[int] = []
    deadline = time.monotonic() + timeout
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        while len(received) < expected and time.monotonic() < deadline:
            method, _, body = channel.basic_get(queue)
            if method is None:
                connection.sleep(0.05)
                continue
            received.append(int(body.split(b".", 1)[0]))
            channel.basic_ack(method.delivery_tag)
    finally:
        connection.close()
    assert len(received) == expected, f"drained {len(received)} of {expected} before the deadline"
    return received


def row(name: str) -> str:
    return f"document.querySelector('#queues tr[data-queue={json.dumps(name)}]')"


async def cell(page: Page, name: str, selector: str) -> str | None:
    value = await page.evaluate(f"{row(name)}?.querySelector({json.dumps(selector)})?.textContent")
    return None if value is None else str(value)


async def state_is(page: Page, name: str, state: str, stops: int) -> bool:
    return (await cell(page, name, ".flow"), await cell(page, name, ".stops")) == (
        state,
        str(stops),
    )


async def blocked_rows(page: Page) -> int:
    return int(await page.evaluate("document.querySelectorAll('#channels tbody tr').length"))


def flowed_channels(gateway: RunningGateway) -> list[dict[str, Any]]:
    return [c for c in gateway.channels() if c["flowStopped"]]


@pytest.mark.asyncio
async def test_console_shows_flow_and_its_buttons_stop_and_start_producers(
    gateway_factory: Callable[..., RunningGateway],
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    tmp_path: Path,
) -> None:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (apt-get install -y chromium; scripts/bootstrap)")
    gateway = gateway_factory()
    name = unique_name("console")
    cleanup_queues.append(name)
    connection = gateway.connect()
    connection.channel().queue_declare(name)
    connection.close()

    async with chromium_page(
        CHROMIUM, f"http://127.0.0.1:{gateway.admin_port}/", tmp_path / "profile"
    ) as page:
        await eventually(
            lambda: state_is(page, name, "OFF", 0), timeout=20, what="the queue row, OFF"
        )

        # Thresholds through the console's form: stop above 50, resume below 25.
        await page.evaluate(f"{row(name)}.querySelector('button[data-action=edit]').click()")
        await page.evaluate(
            "(() => { const f = document.getElementById('edit-form');"
            " f.elements.flowStopCount.value = '50'; f.elements.flowResumeCount.value = '25';"
            " f.elements.flowStopSize.value = '0'; f.elements.flowResumeSize.value = '0';"
            " f.requestSubmit(); })()"
        )
        await eventually(
            lambda: page.evaluate("document.getElementById('edit-message').textContent"),
            timeout=10,
            what="the form's answer",
        )
        queue = gateway.queue(name)
        assert (queue["flowStopCount"], queue["flowResumeCount"]) == (50, 25)
        assert (queue["flowStopSize"], queue["flowResumeSize"]) == (0, 0)

        # A producer runs into the stop threshold: the console shows ON.
        producer = ConfirmingProducer(gateway.url, name, 60)
        producer.start()
        await eventually(
            lambda: state_is(page, name, "ON", 1), timeout=30, what="the queue shown ON"
        )
        await eventually(lambda: blocked_rows(page), timeout=10, what="a blocked channel row")
        assert producer.is_alive()
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(ARTIFACTS / "console.png")

        # Draining frees it: the console shows OFF; nothing lost or reordered.
        received = await asyncio.to_thread(drain, gateway.url, name, 60, 60.0)
        await asyncio.to_thread(producer.join, 10)
        assert producer.error is None
        assert received == list(range(60))
        await eventually(
            lambda: state_is(page, name, "OFF", 1), timeout=20, what="the queue shown OFF again"
        )

        # The row's Stop button holds the next producer; its Start button frees it.
        await page.evaluate(f"{row(name)}.querySelector('button[data-action=stop]').click()")
        await eventually(
            lambda: asyncio.to_thread(
                lambda: (
                    gateway.http("GET", "/api/store")[1]["stops"] == [{"vhost": "/", "queue": name}]
                )
            ),
            timeout=10,
            what="the administrator stop",
        )
        stopped = ConfirmingProducer(gateway.url, name, 3, first=60)
        stopped.start()
        await eventually(
            lambda: asyncio.to_thread(flowed_channels, gateway),
            timeout=20,
            what="the producer's channel flowed",
        )
        await eventually(lambda: blocked_rows(page), timeout=10, what="the console's blocked row")
        assert stopped.confirmed == 0
        assert stopped.is_alive()

        await page.evaluate(f"{row(name)}.querySelector('button[data-action=start]').click()")
        await asyncio.to_thread(stopped.join, 20)
        assert not stopped.is_alive(), "the producer was not freed by Start"
        assert (stopped.error, stopped.confirmed) == (None, 3)
        await eventually(
            lambda: asyncio.to_thread(lambda: not flowed_channels(gateway)),
            timeout=10,
            what="no flowed channel",
        )
        assert await asyncio.to_thread(drain, gateway.url, name, 3, 30.0) == [60, 61, 62]
