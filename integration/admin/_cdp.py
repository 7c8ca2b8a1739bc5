"""A headless chromium driven over the Chrome DevTools Protocol (aiohttp websocket).

Just enough of CDP for the console test: open a page, evaluate JavaScript,
take a screenshot.  Every call is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from rabbitflow_broker.server.rabbitmq_node import free_port

T = TypeVar("T")


class CDPError(RuntimeError):
    """Chromium answered a command with an error or a JavaScript exception."""


class Page:
    """One page target: ``evaluate`` JavaScript, ``screenshot``."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one command; wait (10 s at most) for its answer, skipping events."""
        number = next(self._ids)
        await self._socket.send_str(
            json.dumps({"id": number, "method": method, "params": params or {}})
        )
        async with asyncio.timeout(10):
            while True:
                message = await self._socket.receive()
                if message.type is not aiohttp.WSMsgType.TEXT:
                    raise CDPError(f"{method}: websocket closed ({message.type})")
                answer = json.loads(message.data)
                if answer.get("id") == number:
                    if "error" in answer:
                        raise CDPError(f"{method}: {answer['error']}")
                    return dict(answer.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises awaited).

        Raises:
            CDPError: the expression threw.
        """
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """Save a PNG of the viewport."""
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(result["data"]))


@contextlib.asynccontextmanager
async def chromium_page(
    executable: str, url: str, profile: Path, *, width: int = 1500, height: int = 1000
) -> AsyncIterator[Page]:
    """Launch headless chromium, open ``url``; the browser is killed on exit."""
    port = free_port()
    process = subprocess.Popen(
        [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            base = f"http://127.0.0.1:{port}"

            async def new_target() -> dict[str, Any] | None:
                try:
                    async with session.put(f"{base}/json/new?{quote(url, safe='')}") as response:
                        return dict(await response.json()) if response.status == 200 else None
                except aiohttp.ClientError:
                    return None

            target = await eventually(new_target, timeout=30, what="chromium's DevTools endpoint")
            async with session.ws_connect(
                target["webSocketDebuggerUrl"], max_msg_size=64 << 20
            ) as socket:
                page = Page(socket)
                await page.send("Runtime.enable")
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


async def eventually(
    condition: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """Await ``condition`` until it returns something truthy.

    Raises:
        AssertionError: at the deadline, naming ``what`` and the last value.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await condition()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
