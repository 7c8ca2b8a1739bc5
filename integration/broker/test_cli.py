"""The ``rabbitflow-broker`` console script as a real process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pika

from integration.broker.conftest import wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port, wait_for_amqp

BIN = Path(sys.executable).with_name("rabbitflow-broker")


def test_console_script_relays_logs_events_and_stops_on_sigterm(
    broker: Broker,
    tmp_path: Path,
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
) -> None:
    port, admin = free_port(), free_port()
    events = tmp_path / "events.jsonl"
    process = subprocess.Popen(
        [
            str(BIN),
            "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin}",
            "--upstream", broker.url,
            "--management-url", broker.management_url or "http://127.0.0.1:15672",
            "--event-log", str(events),
            "--log-format", "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for_amqp("127.0.0.1", port, deadline_s=30)
        queue = unique_name("cli")
        cleanup_queues.append(queue)
        connection = pika.BlockingConnection(
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
        )
        channel = connection.channel()
        channel.queue_declare(queue, arguments={"qpid.flow_stop_count": 1})
        channel.basic_publish("", queue, b"1")
        channel.basic_publish("", queue, b"2")  # 2 > 1: overfull
        wait_for(lambda: events.exists() and events.read_text(), what="an event logged")
        connection.close()
    except BaseException:
        process.kill()
        raise
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    codes = [json.loads(line)["code"] for line in events.read_text().splitlines()]
    assert "QUE-1003" in codes
    log_lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert any("QUE-1003" in line["event"] for line in log_lines)


def test_bad_option_exits_2_naming_it() -> None:
    result = subprocess.run(
        [str(BIN), "--default-queue-limit", "plenty"], check=False, capture_output=True, timeout=30
    )
    assert result.returncode == 2
    assert b"--default-queue-limit" in result.stderr
