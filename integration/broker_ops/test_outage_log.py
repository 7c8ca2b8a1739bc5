"""An outage of RabbitMQ is one "upstream lost" line and one "upstream back" line.

A real ``rabbitflow-broker`` process in front of a throwaway node; the node
is stopped for a few seconds and started again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.broker.conftest import serving, wait_for
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import free_port

BROKER_CLI = str(Path(sys.executable).with_name("rabbitflow-broker"))
OUTAGE_S = 5.0


def _records(log: Path) -> list[dict[str, object]]:
    records = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_outage_logs_one_lost_line_and_one_back_line(
    throwaway_broker: Broker, tmp_path: Path
) -> None:
    node = throwaway_broker.node
    assert node is not None
    log = tmp_path / "gateway.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RABBITFLOW_BROKER_")}
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                BROKER_CLI,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                throwaway_broker.url,
                "--management-url",
                throwaway_broker.management_url or "",
                "--log-format",
                "json",
                "--state-file",
                str(tmp_path / "state.json"),
            ],
            stderr=stderr,
            env=environ,
        )
    try:
        wait_for(lambda: serving(log), timeout=30, what="gateway ready and listening")
        node.stop()
        wait_for(lambda: "upstream lost" in log.read_text(), timeout=30, what="upstream lost")
        time.sleep(OUTAGE_S)  # the outage itself: the gateway polls every second meanwhile
        node.start()
        wait_for(lambda: "upstream back" in log.read_text(), timeout=120, what="upstream back")
    finally:
        process.terminate()
        process.wait(30)

    events = [str(r.get("event")) for r in _records(log)]
    warnings = [str(r.get("event")) for r in _records(log) if r.get("level") == "warning"]
    assert events.count("upstream lost") == 1
    assert events.count("upstream back") == 1
    assert not [
        w for w in warnings if w not in ("upstream lost", "upstream still lost", "upstream back")
    ], warnings
