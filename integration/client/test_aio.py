"""``rabbitflow.aio`` against a real RabbitMQ (and the gateway): flow control
suspends tasks, never the loop.

* a full ``x-overflow: reject-publish`` queue: every task's send raises
  FlowControlTimeoutError (also a TimeoutError) after the wait-failure, with
  the "delayed" warnings; the messages nacked before are re-sent once the
  queue drains, though nobody sends again;
* cancelling a task blocked in send(): the message is not sent and the
  producer stays usable;
* the loop stays responsive (at most 20 ms of lag of its own at every tick)
  while 100 tasks are blocked in send(), while 50 tasks publish at full
  speed, and while one task fills a window of 5,000;
* the gateway's flow control with 20 tasks sharing one connection: RabbitMQ's
  depth never exceeds stop + the sum of the producers' capacities;
* a consumer under its flow limit, ``async for``: exactly once, in order
  per producer.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

import rabbitflow
from rabbitflow import aio

from ..conftest import Broker
from ._support import (
    CLIENT_LOGGER,
    QueueCollector,
    client_messages,
    declare_queue,
    drain,
    publish_bodies,
    ready_count,
)

FAST = {
    "qpid.flow_control_wait_failure": 3000,
    "qpid.flow_control_wait_notify_period": 1000,
}


def _full_reject_publish_queue(url: str, name: str, length: int) -> None:
    declare_queue(url, name, {"x-max-length": length, "x-overflow": "reject-publish"})
    publish_bodies(url, name, [b"filler"] * length)


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_every_task_times_out_on_a_full_reject_publish_queue_then_nacked_ones_are_resent(
    broker: Broker,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    name = new_queue("aio-reject")
    _full_reject_publish_queue(broker.url, name, 10)
    tasks = 20
    factory = aio.ConnectionFactory(broker.url, properties=FAST)
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        queue = await session.create_queue(name)
        producers = [await session.create_producer(queue, capacity=5) for _ in range(tasks)]

        async def sender(index: int, producer: aio.MessageProducer) -> tuple[int, BaseException]:
            sent = 0
            started = time.monotonic()
            while True:
                try:
                    await producer.send(session.create_text_message(f"{index}:{sent}"))
                except rabbitflow.JMSException as exc:
                    assert time.monotonic() - started >= 2.9
                    return sent, exc
                sent += 1

        results = await asyncio.wait_for(
            asyncio.gather(*(sender(i, p) for i, p in enumerate(producers))), 60
        )
        for sent, error in results:
            assert isinstance(error, rabbitflow.FlowControlTimeoutError)
            assert isinstance(error, TimeoutError)
            assert str(error) == (
                "Unable to send message for 3 seconds due to broker enforced flow control"
            )
            assert sent >= 1
        warnings = client_messages(caplog.records, logging.WARNING)
        for seconds in (1, 2):
            delayed = f"Message send delayed by {seconds}s due to broker enforced flow control"
            assert warnings.count(delayed) == tasks
        errors = client_messages(caplog.records, logging.ERROR)
        assert (
            errors.count(
                "Message send failed due to timeout waiting on broker enforced flow control"
            )
            == tasks
        )

        # The accepted messages were nacked; drain the queue and the SDK
        # re-sends them although no task sends again.
        accepted = {f"{i}:{n}" for i, (sent, _) in enumerate(results) for n in range(sent)}
        collector = QueueCollector(broker.url, name).start()
        try:
            await _until(
                lambda: all(p.unconfirmed_count == 0 for p in producers),
                60,
                "every accepted message to be confirmed",
            )
            await _until(lambda: collector.count >= 10 + len(accepted), 30, "the re-sent messages")
        finally:
            bodies = collector.stop()
    got = [b.decode() for b in bodies if b != b"filler"]
    assert sorted(got) == sorted(accepted)  # every accepted message exactly once
    for index in range(tasks):
        own = [int(g.split(":")[1]) for g in got if g.startswith(f"{index}:")]
        assert own == sorted(own), f"task {index}'s messages were reordered"


@pytest.mark.asyncio
async def test_cancelling_a_task_blocked_in_send_leaves_the_message_unsent(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    name = new_queue("aio-cancel")
    _full_reject_publish_queue(broker.url, name, 1)
    factory = aio.ConnectionFactory(
        broker.url, properties={"qpid.flow_control_wait_failure": 60000}
    )
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        producer = await session.create_producer(await session.create_queue(name), capacity=5)
        await producer.send(session.create_text_message("accepted"))  # will be nacked
        await _until(lambda: producer.nacked_count >= 1, 10, "the nack")
        blocked = asyncio.create_task(producer.send(session.create_text_message("cancelled")))
        await asyncio.sleep(0.3)
        assert not blocked.done(), "send() should be suspended under flow control"
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert producer.sent_count == 1
        assert drain(broker.url, name) == [b"filler"]  # make room
        await _until(lambda: producer.unconfirmed_count == 0, 30, "the re-send of 'accepted'")
        assert drain(broker.url, name) == [b"accepted"]  # make room again
        await producer.send(session.create_text_message("after"))  # still usable
        await _until(lambda: producer.unconfirmed_count == 0, 30, "the confirm of 'after'")
    assert drain(broker.url, name) == [b"after"]


def _thread_times() -> tuple[float, float]:
    """Seconds this thread has spent on a CPU, and runnable but waiting for
    one (Linux's per-thread scheduler statistics; zeros where they are not
    kept)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            on_cpu, waiting = stats.read().split()[:2]
            return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


#: docs/client.md: "send() yields to the loop once every 64 such sends".
SENDS_PER_TURN = 64


class _Ticker:
    """Measures event-loop lag: how late a 5 ms sleep wakes up.

    ``lags`` is the lag as the wall clock sees it.  ``own_lags`` takes away
    the time the loop's thread was ready to run but the operating system
    gave the CPU to other processes (a loaded machine): what is left is the
    lag the loop's own work caused (callbacks, garbage collection, a
    blocking call), which is what the driver decides.  ``on_cpu`` is how
    much of each tick the thread spent on a CPU: what separates the loop's
    work from a call that blocked it.
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.own_lags: list[float] = []
        self.late: list[tuple[float, float]] = []  # (when the tick was due, when it ran)
        self.on_cpu: list[float] = []  # of each tick, the loop thread's time on a CPU
        self._stop = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            start, (ran, queued) = loop.time(), _thread_times()
            # asyncio.sleep(0.005), with the timer's own deadline at hand (the
            # thread may be preempted between reading the clock and arming it).
            woken: asyncio.Future[None] = loop.create_future()
            timer = loop.call_later(0.005, woken.set_result, None)
            await woken
            woke = loop.time()
            lag = woke - start - 0.005
            self.late.append((timer.when(), woke))
            self.lags.append(lag)
            ran_after, queued_after = _thread_times()
            self.own_lags.append(max(lag - (queued_after - queued), 0.0))
            self.on_cpu.append(ran_after - ran)

    def stop(self) -> None:
        self._stop.set()


class _Phase:
    """A ticker running while one phase of the test runs."""

    async def __aenter__(self) -> _Phase:
        # The test worker's heap holds what earlier tests left: a full
        # collection of it (100 ms and more late in a run) is the worker's,
        # not the driver's.  Frozen, collections see only what this phase makes.
        gc.collect()
        gc.freeze()
        self._ticker = _Ticker()
        self._task = asyncio.create_task(self._ticker.run())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self._ticker.stop()
        await self._task
        gc.unfreeze()
        self.lags = (self._ticker.lags, self._ticker.own_lags)
        self.late = self._ticker.late
        self.on_cpu = self._ticker.on_cpu

    def most_sends_while_due(self, sent_at: list[float]) -> int:
        """The most of the ``sent_at`` sends made while one tick was due but
        had not yet run: how much work the producer did before it let the loop
        serve other tasks."""
        sends = sorted(sent_at)
        return max(
            (bisect.bisect_right(sends, woke) - bisect.bisect_left(sends, due))
            for due, woke in self.late
        )


@pytest.mark.asyncio
async def test_the_loop_stays_responsive_with_tasks_blocked_and_tasks_publishing(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    blocked_name, busy_name = new_queue("aio-lag-blocked"), new_queue("aio-lag-busy")
    _full_reject_publish_queue(broker.url, blocked_name, 1)
    factory = aio.ConnectionFactory(
        broker.url, properties={"qpid.flow_control_wait_failure": 60000}
    )
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        stuck = await session.create_producer(await session.create_queue(blocked_name))
        await stuck.send(session.create_text_message("nacked"))
        await _until(lambda: stuck.nacked_count >= 1, 10, "the nack")
        started = 0

        async def send_blocked(n: int) -> None:
            nonlocal started
            started += 1  # (then on, in the same step, into send() until it suspends)
            await stuck.send(session.create_text_message(str(n)))

        waiting = [asyncio.create_task(send_blocked(n)) for n in range(100)]
        await _until(lambda: started == 100, 10, "every task to block in send()")
        async with _Phase() as blocked:
            await asyncio.sleep(2.0)
            assert not any(t.done() for t in waiting), "the sends should still be blocked"

        busy = await session.create_producer(await session.create_queue(busy_name))

        busy_sent_at: list[float] = []
        loop = asyncio.get_running_loop()

        async def publish(index: int) -> None:
            for n in range(200):
                await busy.send(
                    session.create_text_message(f"{index}:{n}"),
                    delivery_mode=rabbitflow.NON_PERSISTENT,
                )
                busy_sent_at.append(loop.time())

        async with _Phase() as publishing:
            await asyncio.wait_for(asyncio.gather(*(publish(i) for i in range(50))), 120)

        # One task, a window of 5,000: its sends never wait, yet the loop runs.
        wide = await session.create_producer(await session.create_queue(busy_name), capacity=5000)
        sent_at: list[float] = []
        async with _Phase() as widely:
            for n in range(10000):
                await wide.send(
                    session.create_text_message(f"wide:{n}"),
                    delivery_mode=rabbitflow.NON_PERSISTENT,
                )
                sent_at.append(loop.time())
            await _until(lambda: wide.unconfirmed_count == 0, 60, "the wide window's confirms")
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        drain(broker.url, blocked_name)
        await _until(lambda: stuck.unconfirmed_count == 0, 30, "the nacked message's re-send")
    assert ready_count(broker.url, busy_name) == 50 * 200 + 10000
    phases = (
        ("100 tasks blocked", blocked),
        ("50 tasks publishing", publishing),
        ("1 task, window 5,000", widely),
    )
    counted = {
        "50 tasks publishing": (publishing, busy_sent_at, busy.capacity),
        "1 task, window 5,000": (widely, sent_at, SENDS_PER_TURN),
    }
    for label, ticked in phases:
        lags, own = ticked.lags
        assert len(lags) >= 20, f"{label}: the ticker hardly ran ({len(lags)} ticks)"
        at = own.index(max(own))
        state = (
            f"{label}: {len(lags)} ticks, loop lag median {statistics.median(lags) * 1000:.1f} ms, "
            f"max {max(lags) * 1000:.1f} ms; the loop's own part max {max(own) * 1000:.1f} ms "
            f"(its thread on a CPU {ticked.on_cpu[at] * 1000:.1f} ms of that tick), "
            f"second {sorted(own)[-2] * 1000:.1f} ms"
        )
        # Each tick's own part is the loop's work (callbacks, garbage
        # collection, a blocking call) less the time other processes held the
        # CPU: the operating system's, not the driver's.  How much of that
        # work one turn holds is what the driver decides, and it is counted,
        # not timed, wherever the driver works (a machine of this kind twice
        # as slow takes twice the time for the same turns).
        print(state)  # shown with -s: the figures of docs/client.md
        worst, second = sorted(own)[-1], sorted(own)[-2]
        if label.startswith("100"):
            # The driver does nothing while the sends wait: every tick but
            # one within 20 ms.  The one let off (and held to 50 ms) is for a
            # single event the driver does not cause, seen once: a full
            # garbage collection of this large test process, or CPU the
            # hypervisor took.
            assert second <= 0.020, state
            assert worst <= 0.050, state
            continue
        # A send waits for room in the window, and room comes only with the
        # confirms that one read of the socket hands over: a tick that falls
        # due waits for at most three turns (the turn under way, the one
        # queued before the tick's timer was seen to expire, and the one
        # queued before the task the timer wakes; the timer's callback only
        # schedules the ticker's next step), and one turn sends at most a
        # window's worth (the 50 tasks share one window of 100), or
        # SENDS_PER_TURN for a task whose sends never wait (the window of
        # 5,000).  Each tick is held to 100 ms in time, the margin for a
        # machine of this kind twice as slow (the turns of the wide window,
        # at 128 sends, reached 22 ms on a loaded machine, 51 and once 143 ms
        # in CI: its turns are now 64 sends).
        phase, sends, window = counted[label]
        most = phase.most_sends_while_due(sends)
        print(f"{label}: at most {most} sends while a tick was due")
        assert most <= 3 * window, f"{state}; {most} sends while a tick was due"
        assert worst <= 0.100, state


def _gateway_connection(url: str) -> pika.BlockingConnection:
    """A connection to the gateway once it accepts logins (it refuses them
    until its first routing snapshot from the management API)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class _DepthSampler(threading.Thread):
    """Samples a queue's depth on RabbitMQ itself (not through the gateway)."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self._url, self._queue = url, queue
        self._halt = threading.Event()
        self.peak = 0
        self.samples = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self._url))
            try:
                channel = connection.channel()
                while not self._halt.is_set():
                    depth = channel.queue_declare(self._queue, passive=True).method.message_count
                    self.peak = max(self.peak, depth)
                    self.samples += 1
                    connection.process_data_events(0.01)  # also answers heartbeats
            finally:
                connection.close()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@pytest.mark.asyncio
async def test_gateway_flow_holds_twenty_tasks_sharing_a_connection(
    broker: Broker,
    gateway_url: str,
    new_queue: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    name = new_queue("aio-gw")
    stop, resume, capacity, tasks, each = 50, 25, 5, 20, 30
    declarer = _gateway_connection(gateway_url)
    declarer.channel().queue_declare(
        name,
        durable=True,
        arguments={"qpid.flow_stop_count": stop, "qpid.flow_resume_count": resume},
    )
    declarer.close()
    sampler = _DepthSampler(broker.url, name)
    sampler.start()
    factory = aio.ConnectionFactory(
        gateway_url, properties={"qpid.flow_control_wait_failure": 60000}
    )
    collector: QueueCollector | None = None
    try:
        async with await factory.create_connection() as connection:
            session = connection.create_session()
            queue = await session.create_queue(name)
            producers = [
                await session.create_producer(queue, capacity=capacity) for _ in range(tasks)
            ]

            async def sender(index: int, producer: aio.MessageProducer) -> None:
                for n in range(each):
                    await producer.send(session.create_text_message(f"{index}:{n}"))

            sending = asyncio.gather(*(sender(i, p) for i, p in enumerate(producers)))
            await _until(
                lambda: any(p.flow_state != "open" for p in producers), 30, "the gateway's flow"
            )
            assert not sending.done()
            collector = QueueCollector(broker.url, name).start()
            await asyncio.wait_for(sending, 120)
            await _until(
                lambda: all(p.unconfirmed_count == 0 for p in producers), 30, "every confirm"
            )
            await _until(
                lambda: collector is not None and collector.count >= tasks * each,
                30,
                "every message",
            )
    finally:
        sampler.stop()
        bodies = collector.stop() if collector is not None else []
    assert sampler.error is None, repr(sampler.error)
    assert sampler.samples > 10
    assert sampler.peak <= stop + tasks * capacity, f"peak {sampler.peak}"
    assert sampler.peak >= stop  # the run did reach the threshold
    per_task: dict[int, list[int]] = defaultdict(list)
    for body in bodies:
        index, n = body.decode().split(":")
        per_task[int(index)].append(int(n))
    assert {i: per_task[i] for i in range(tasks)} == {i: list(range(each)) for i in range(tasks)}
    infos = client_messages(caplog.records, logging.INFO)
    assert "Broker enforced flow control has been enforced" in infos


@pytest.mark.asyncio
async def test_async_for_under_the_consumer_flow_limit_exactly_once_in_order(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    name = new_queue("aio-consume")
    limit, producers_n, each = 20, 3, 300
    factory = aio.ConnectionFactory(broker.url, properties={"imqConsumerFlowLimit": limit})
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        queue = await session.create_queue(name)

        async def sender(index: int) -> None:
            async with await session.create_producer(queue, capacity=10) as producer:
                for n in range(each):
                    await producer.send(session.create_text_message(f"{index}:{n}"))

        await asyncio.gather(*(sender(i) for i in range(producers_n)))
        consumer = await session.create_consumer(queue)
        connection.start()
        got: dict[int, list[int]] = defaultdict(list)
        peak = 0
        total = 0
        async for message in consumer:
            assert isinstance(message, rabbitflow.TextMessage)
            index, n = message.text.split(":")
            got[int(index)].append(int(n))
            peak = max(peak, consumer.flow_stats().buffered)
            total += 1
            if total == producers_n * each:
                break
        assert await consumer.receive(0.3) is None  # nothing more: exactly once
        await consumer.close()
    assert peak <= limit
    assert dict(got) == {i: list(range(each)) for i in range(producers_n)}


@pytest.mark.asyncio
async def test_client_acknowledge_on_asyncio(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    name = new_queue("aio-clientack")
    declare_queue(broker.url, name)
    publish_bodies(broker.url, name, [b"1", b"2", b"3"])
    factory = aio.ConnectionFactory(broker.url)
    async with await factory.create_connection() as connection:
        session = connection.create_session(rabbitflow.CLIENT_ACKNOWLEDGE)
        consumer = await session.create_consumer(await session.create_queue(name))
        connection.start()
        first = await consumer.receive(10)
        second = await consumer.receive(10)
        assert first is not None
        assert second is not None
        second.acknowledge()  # acknowledges both, as in JMS
        await consumer.close()  # the third, unacknowledged, goes back
    assert drain(broker.url, name) == [b"3"]


@pytest.mark.asyncio
async def test_the_connection_flow_limit_is_one_total_for_its_consumers(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    names = [new_queue("aio-connlimit-a"), new_queue("aio-connlimit-b")]
    each, total_limit = 400, 30
    for name in names:
        declare_queue(broker.url, name)
        publish_bodies(broker.url, name, (str(n).encode() for n in range(each)))
    factory = aio.ConnectionFactory(
        broker.url,
        properties={
            "imqConsumerFlowLimit": 25,
            "imqConnectionFlowLimitEnabled": "true",
            "imqConnectionFlowLimit": total_limit,
        },
    )
    async with await factory.create_connection() as connection:
        session = connection.create_session()
        consumers = [await session.create_consumer(await session.create_queue(n)) for n in names]
        connection.start()
        peak = 0

        async def read(consumer: aio.MessageConsumer) -> list[int]:
            nonlocal peak
            got: list[int] = []
            while len(got) < each:
                message = await consumer.receive(10)
                assert message is not None, f"stalled after {len(got)}"
                assert isinstance(message, rabbitflow.TextMessage | rabbitflow.BytesMessage)
                got.append(int(message.body_bytes()))
                peak = max(peak, connection.buffered_count)
                await asyncio.sleep(0)  # let the other consumer's deliveries in
            return got

        results = await asyncio.wait_for(asyncio.gather(*(read(c) for c in consumers)), 60)
    assert peak <= total_limit
    assert results == [list(range(each)), list(range(each))]
