"""A fake gateway admin API: a real aiohttp server on a free port in its own thread.

Tests script answers per (method, raw path) with :meth:`FakeAdmin.answer`;
anything unscripted gets aiohttp's plain-text 404, as a gateway without
that route would.  Every request is recorded.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    body: Any
    headers: dict[str, str]


class FakeAdmin:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, method: str, path: str, body: Any, status: int = 200) -> None:
        self._answers[(method, path)] = (status, body)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append(
            Recorded(
                request.method,
                request.raw_path,
                json.loads(raw) if raw else None,
                dict(request.headers),
            )
        )
        scripted = self._answers.get((request.method, request.raw_path))
        if scripted is None:
            raise web.HTTPNotFound()
        status, body = scripted
        return web.json_response(body, status=status)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def admin() -> Iterator[FakeAdmin]:
    fake = FakeAdmin()
    fake.start()
    yield fake
    fake.stop()
