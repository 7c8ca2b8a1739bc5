"""rabbitflow-config against a real gateway in front of the shared RabbitMQ (issue 3 item 7)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pika.exceptions
import pytest

from integration.broker._producers import WindowProducer, wait_done
from integration.broker.conftest import RunningGateway, wait_for
from rabbitflow_broker.cli.config_cli import main

CAPACITY = 10


def cli(gateway: RunningGateway, *argv: str) -> int:
    return main(
        [
            "--admin-url",
            f"http://127.0.0.1:{gateway.admin_port}",
            "--gateway-url",
            gateway.url,
            *argv,
        ],
        environ={},
    )


def printed_json(out: str) -> dict[str, object]:
    # The in-process gateway's console log shares stdout; the JSON starts at a bare "{".
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return dict(json.loads("\n".join(lines[start:])))


def delete_through(gateway: RunningGateway, queue: str) -> None:
    # Through the gateway, so it forgets the runtime thresholds it stored for the queue.
    connection = gateway.connect()
    connection.channel().queue_delete(queue)
    connection.close()


def test_add_queue_declares_through_the_gateway_with_its_thresholds(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_name("add")
    cleanup_queues.append(queue)

    code = cli(
        gateway,
        "add", "queue", queue, "--max-count", "1000",
        "--flow-stop-count", "300", "--flow-resume-count", "200",
    )  # fmt: skip

    assert code == 0, capsys.readouterr().err
    assert "declared" in capsys.readouterr().out
    shown = gateway.queue(queue)
    assert (shown["flowStopCount"], shown["flowResumeCount"]) == (300, 200)
    assert shown["source"] == "arguments"
    assert cli(gateway, "queue", queue, "--json") == 0
    assert printed_json(capsys.readouterr().out)["flowStopCount"] == 300


def test_add_queue_with_resume_above_stop_is_refused_by_the_gateway(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_name("bad")
    cleanup_queues.append(queue)

    code = cli(
        gateway, "add", "queue", queue, "--flow-stop-count", "10", "--flow-resume-count", "20"
    )

    assert code == 2
    err = capsys.readouterr().err
    assert "406" in err
    assert "qpid.flow_resume_count" in err
    assert err.count("\n") == 1


def test_set_flow_on_an_unknown_queue_exits_1(
    gateway: RunningGateway, unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(gateway, "set-flow", unique_name("ghost"), "--flow-stop-count", "5") == 1

    assert "not found" in capsys.readouterr().err


@pytest.mark.slow
def test_set_flow_blocks_a_running_producer_at_once_and_survives_a_restart(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_name("setflow")
    cleanup_queues.append(queue)
    # Flow control disabled at declare: nothing but set-flow can stop the producer.
    assert cli(gateway, "add", "queue", queue, "--flow-stop-count", "0") == 0
    producer = WindowProducer(gateway.url, queue, pid="p", count=100_000, capacity=CAPACITY)
    producer.start()
    try:
        wait_for(lambda: producer.confirmed >= 200, what="the producer running unhindered")
        assert not producer.flowed

        assert cli(gateway, "set-flow", queue, "--flow-stop-count", "150",
                   "--flow-resume-count", "100") == 0  # fmt: skip

        wait_for(lambda: producer.flowed, what="the running producer flowed by the new threshold")
        stopped = wait_for(
            lambda: (q := gateway.queue(queue))["flowStopped"] and q, what="queue flow ON"
        )
        assert (stopped["flowStopCount"], stopped["flowResumeCount"]) == (150, 100)
        assert stopped["source"] == "runtime"
        assert len(gateway.events("QUE-1003", queue)) == 1
        assert producer.sent < producer.count
    finally:
        producer.stop()
        wait_done(producer, timeout=30)
    capsys.readouterr()

    gateway.restart()

    assert cli(gateway, "queue", queue, "--json") == 0
    after = printed_json(capsys.readouterr().out)
    assert (after["flowStopCount"], after["flowResumeCount"]) == (150, 100)
    assert after["source"] == "runtime"
    # Still enforced after the restart: the queue is over 150, a new producer is flowed.
    late = WindowProducer(gateway.url, queue, pid="late", count=100_000, capacity=CAPACITY)
    late.start()
    try:
        wait_for(lambda: late.flowed, what="a producer after the restart flowed")
        assert gateway.queue(queue)["flowStopped"] is True
    finally:
        late.stop()
        wait_done(late, timeout=30)
    delete_through(gateway, queue)


def test_add_queue_and_delete_queue_through_the_gateway(
    gateway: RunningGateway,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = unique_name("addq")
    cleanup_queues.append(queue)

    assert cli(gateway, "add-queue", queue, "--flow-stop-count", "30") == 0, capsys.readouterr()
    assert gateway.queue(queue)["flowStopCount"] == 30
    connection = gateway.connect()
    connection.channel().basic_publish("", queue, b"x")
    connection.close()
    wait_for(lambda: gateway.queue(queue)["messages"] == 1, timeout=10)
    capsys.readouterr()

    # --if-empty refuses (406) and keeps the queue and its message.
    assert cli(gateway, "delete-queue", queue, "--if-empty") == 2
    assert "406" in capsys.readouterr().err
    assert gateway.queue(queue)["messages"] == 1

    assert cli(gateway, "delete-queue", queue) == 0
    assert f"Queue {queue!r} deleted in vhost '/' (1 messages with it)" in capsys.readouterr().out
    probe = gateway.connect()
    channel = probe.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
        channel.queue_declare(queue, passive=True)
    if probe.is_open:
        probe.close()
