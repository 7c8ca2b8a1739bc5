"""A raw-pika producer with a confirm window that honours ``Channel.Flow``.

It stands for "a producer of capacity c that honours flow control" without
the rabbitflow SDK: at most ``capacity`` unconfirmed publishes, and no
publish while the broker has flowed its channel.  Runs in its own thread.
"""

from __future__ import annotations

import threading
from typing import Any

import pika
from pika import spec


class WindowProducer(threading.Thread):
    """Publishes ``b"<pid>:<seq>"`` to ``queue`` via the default exchange.

    It sends until ``count`` messages are sent; ``count`` may be raised or
    lowered while it runs (None: no limit yet).
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        pid: str,
        count: int | None,
        capacity: int,
        body_size: int = 0,
    ) -> None:
        super().__init__(name=f"producer-{pid}", daemon=True)
        self.url = url
        self.queue = queue
        self.pid = pid
        self.count = count
        self.capacity = capacity
        self.body_size = body_size
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self.flowed = False
        self.flow_changes: list[bool] = []
        self.max_unconfirmed = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._stop_requested = threading.Event()

    def stop(self) -> None:
        self._stop_requested.set()

    def _on_flow(self, frame: Any) -> None:
        self.flowed = not frame.method.active
        self.flow_changes.append(bool(frame.method.active))

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        covered = [t for t in self._outstanding if t <= tag] if method.multiple else [tag]
        for t in covered:
            self._outstanding.discard(t)
            if isinstance(method, spec.Basic.Ack):
                self.confirmed += 1
            else:
                self.nacked += 1

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        impl = channel._impl
        impl.add_on_flow_callback(self._on_flow)
        selected = threading.Event()
        impl.confirm_delivery(self._on_confirm, callback=lambda _frame: selected.set())
        while not selected.is_set():
            connection.process_data_events(time_limit=0.05)
        self._outstanding: set[int] = set()
        seq_tag = 0
        padding = b"." * self.body_size
        try:
            while not self._stop_requested.is_set():
                count = self.count
                if count is not None and self.sent >= count and not self._outstanding:
                    break
                can_send = (
                    (count is None or self.sent < count)
                    and not self.flowed
                    and len(self._outstanding) < self.capacity
                )
                if can_send:
                    impl.basic_publish("", self.queue, f"{self.pid}:{self.sent}".encode() + padding)
                    seq_tag += 1
                    self._outstanding.add(seq_tag)
                    self.sent += 1
                    self.max_unconfirmed = max(self.max_unconfirmed, len(self._outstanding))
                    connection.process_data_events(time_limit=0)
                else:
                    connection.process_data_events(time_limit=0.02)
        finally:
            connection.close()

    @property
    def unconfirmed(self) -> int:
        return len(getattr(self, "_outstanding", ()))


def wait_done(producer: Any, timeout: float) -> None:
    """Wait for a producer thread (anything with ``done``, ``error``, ``pid``)."""
    if not producer.done.wait(timeout):
        raise AssertionError(
            f"producer {producer.pid} not done after {timeout}s: "
            f"sent {getattr(producer, 'sent', '?')}/{producer.count}"
        )
    if producer.error is not None:
        raise AssertionError(f"producer {producer.pid} failed: {producer.error!r}")
