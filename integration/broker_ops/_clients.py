"""Producers and a draining consumer for the gateway-operations tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import pika

BODY_SIZE = 10 * 1024


def body(pid: str, seq: int, size: int = BODY_SIZE) -> bytes:
    """``<pid>:<seq>`` padded to ``size`` bytes."""
    return f"{pid}:{seq}:".encode().ljust(size, b".")


def parse(raw: bytes) -> tuple[str, int]:
    """The (pid, seq) of a :func:`body`."""
    pid, seq, _ = raw.split(b":", 2)
    return pid.decode(), int(seq)


class SdkProducer(threading.Thread):
    """A rabbitflow SDK producer of persistent 10 KB messages until told to stop."""

    def __init__(self, url: str, queue: str, *, pid: str, capacity: int = 20) -> None:
        super().__init__(name=f"sdk-producer-{pid}", daemon=True)
        self.url, self.queue, self.pid, self.capacity = url, queue, pid, capacity
        self.sent = 0
        self.error: BaseException | None = None
        self.halt = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        import rabbitflow

        try:
            factory = rabbitflow.ConnectionFactory(
                self.url, properties={"qpid.flow_control_wait_failure": 120_000}
            )
            with factory.create_connection() as connection:
                session = connection.create_session()
                producer = session.create_producer(
                    session.create_queue(self.queue), capacity=self.capacity
                )
                while not self.halt.is_set():
                    producer.send(session.create_bytes_message(body(self.pid, self.sent)))
                    self.sent += 1
                producer.close()
                session.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


class Drainer:
    """Consumes (with acks) from queues through a blocking pika connection."""

    def __init__(self, url: str, queues: Iterable[str]) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=50)
        self.received: dict[str, list[int]] = {}
        for queue in queues:
            self.channel.basic_consume(queue, self._on_message)

    def _on_message(
        self,
        channel: pika.adapters.blocking_connection.BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _properties: pika.BasicProperties,
        raw: bytes,
    ) -> None:
        pid, seq = parse(raw)
        self.received.setdefault(pid, []).append(seq)
        channel.basic_ack(method.delivery_tag)

    def until(self, condition: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Consume until ``condition()`` holds; AssertionError at the deadline."""
        import time

        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s draining until {what}")
            self.connection.process_data_events(time_limit=0.05)

    def close(self) -> None:
        self.connection.close()
