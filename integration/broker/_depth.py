"""A queue's depth sampled straight from RabbitMQ, not from the gateway's own count."""

from __future__ import annotations

import threading
import time

from integration.conftest import Broker

__all__ = ["SAMPLE_INTERVAL_S", "SETTLED_SAMPLES", "DepthWatcher"]

SAMPLE_INTERVAL_S = 0.05
#: The depth has settled when this many samples in a row (0.5 s) are equal.
SETTLED_SAMPLES = 10


class DepthWatcher(threading.Thread):
    """Samples a queue's ready count straight from RabbitMQ; keeps the maximum.

    The queue must exist before :meth:`start`.  :attr:`maximum` is readable
    while it runs (to wait until RabbitMQ holds some depth); :meth:`finish`
    stops it and returns the maximum.
    """

    def __init__(self, broker: Broker, queue: str) -> None:
        super().__init__(daemon=True)
        self._broker = broker
        self._queue = queue
        self._halt = threading.Event()
        self.maximum = 0
        self._settle_deadline = float("inf")
        self._recent: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = self._broker.blocking_connection()
            try:
                channel = connection.channel()
                # After the clients are done, go on until the depth has settled (what
                # the gateway still had in flight has reached the queue), within a deadline.
                while not (self._halt.is_set() and self._settled(self._recent)):
                    depth = channel.queue_declare(self._queue, passive=True).method.message_count
                    self.maximum = max(self.maximum, depth)
                    self._recent = [*self._recent[-(SETTLED_SAMPLES - 1) :], depth]
                    time.sleep(SAMPLE_INTERVAL_S)
            finally:
                connection.close()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def steady(self) -> bool:
        """Whether the last samples (0.5 s) were all equal; raises if sampling failed."""
        if self.error is not None:
            raise AssertionError(f"depth sampling failed: {self.error!r}")
        recent = self._recent
        return len(recent) == SETTLED_SAMPLES and len(set(recent)) == 1

    def _settled(self, recent: list[int]) -> bool:
        if time.monotonic() > self._settle_deadline:
            raise AssertionError(f"queue depth still moving 10 s after the clients: {recent}")
        return len(recent) == SETTLED_SAMPLES and len(set(recent)) == 1

    def finish(self) -> int:
        """Sample until the depth has settled; return the largest depth seen."""
        self._settle_deadline = time.monotonic() + 10
        self._halt.set()
        self.join(timeout=20)
        if self.is_alive():
            raise AssertionError("depth sampling did not stop within 20 s")
        if self.error is not None:
            raise AssertionError(f"depth sampling failed: {self.error!r}")
        return self.maximum
