"""How ``rabbitflow-demo`` tells its run (:mod:`rabbitflow_broker.cli.demo`).

The printer that serialises and time-stamps the lines of the demo's
threads, the narrator that tells the run in screen-sized phases, the sink
and log handler that feed it the gateway's events and the client SDK's
flow-control log lines, and the structlog set-up that keeps the in-process
gateway's own logging out of the way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

import structlog

from rabbitflow_broker.events import Event
from rabbitflow_broker.server.service import EventSink

__all__: list[str] = []


class _Printer:
    """Serialises output lines from the demo's threads; stamps them with elapsed time."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def line(self, text: str) -> None:
        with self._lock:
            print(f"{time.monotonic() - self._t0:6.1f}s  {text}", file=self._out, flush=True)

    def plain(self, text: str = "") -> None:
        with self._lock:
            print(text, file=self._out, flush=True)


class _Narrator:
    """Tells the run in phases, each about a screen long.

    Phase 1 (filling) and the first stop/resume cycle are shown line by
    line; from the second cycle on, each cycle is one line (when the queue
    went overfull and underfull again, its peak, how many channel blocks)
    and the depth is shown every few seconds.
    """

    _QUIET_DEPTH_S = 3.0

    def __init__(self, printer: _Printer) -> None:
        self._printer = printer
        self._lock = threading.Lock()
        self._cycle = 0  # overfull transitions seen
        self._cycle_started = 0.0
        self._cycle_peak = 0
        self._cycle_blocks = 0
        self._quiet_depth_at = 0.0

    @property
    def detailed(self) -> bool:
        """Still in the line-by-line phases (filling, first cycle)."""
        return self._cycle <= 1

    def event(self, code: str, line: str) -> None:
        with self._lock:
            if code == "QUE-1003":
                self._cycle += 1
                self._cycle_started = time.monotonic()
                self._cycle_peak = 0
                self._cycle_blocks = 0
                if self._cycle == 1:
                    self._printer.plain()
                    self._printer.plain("Phase 2: the queue is overfull: producers are flowed")
                elif self._cycle == 2:
                    self._printer.plain()
                    self._printer.plain(
                        "Phase 3: flow stops and resumes as the consumer drains "
                        "(one line per cycle)"
                    )
            elif code == "CHN-1005":
                self._cycle_blocks += 1
            if self.detailed:
                self._printer.line(line)
            elif code == "QUE-1004":
                self._printer.line(
                    f"cycle {self._cycle:2d}: overfull for "
                    f"{time.monotonic() - self._cycle_started:4.1f} s, peak depth "
                    f"{self._cycle_peak:3d}, {self._cycle_blocks} channel block(s), then "
                    "underfull: producers resume"
                )

    def client(self, line: str) -> None:
        with self._lock:
            if self.detailed:
                self._printer.line(line)

    def observe(self, depth: int) -> None:
        with self._lock:
            self._cycle_peak = max(self._cycle_peak, depth)

    def depth(self, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if self.detailed or now >= self._quiet_depth_at:
                self._quiet_depth_at = now + self._QUIET_DEPTH_S
                self._printer.line(line)

    def note(self, line: str) -> None:
        self._printer.line(line)


class _DemoSink(EventSink):
    """Counts and prints gateway events of the demo queue instead of logging them."""

    def __init__(self) -> None:
        super().__init__(None)
        self.on_event: Callable[[Event], None] = lambda _event: None

    def __call__(self, event: Event) -> None:
        self.on_event(event)


class _ClientLogHandler(logging.Handler):
    """Shows the SDK's flow-control log records as event lines."""

    def __init__(self, narrator: _Narrator, names: Callable[[], dict[str, str]]) -> None:
        super().__init__(logging.INFO)
        self._narrator = narrator
        self._names = names

    def emit(self, record: logging.LogRecord) -> None:
        producer = getattr(record, "producer", None)
        who = self._names().get(str(producer), f"producer {producer}") if producer else "client"
        self._narrator.client(f"[{who}] {record.levelname} {record.getMessage()}")


@contextlib.contextmanager
def _quiet_structlog() -> Iterator[None]:
    # The in-process gateway logs through structlog; send it to stdlib logging
    # (warnings to stderr) so its INFO chatter does not bury the demo's lines.
    if structlog.is_configured():
        yield
        return
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, structlog.stdlib.render_to_log_kwargs],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    try:
        yield
    finally:
        structlog.reset_defaults()
