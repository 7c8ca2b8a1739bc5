"""Property sources reach send() (issue 2, item 5).

Each test runs a small script in a fresh interpreter, so ``RABBITFLOW_OPTS``
is read the way a user's process reads it: once, at ``import rabbitflow``.
The script sends to a reject-publish queue that is already full until a
send raises, and reports how long that send waited and what it said.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..conftest import Broker
from ._support import declare_queue, publish_bodies

SCRIPT = r"""
import json, os, sys, time
import rabbitflow

url, queue, factory_props, system_props = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rabbitflow.system_properties.update(json.loads(system_props))
factory = rabbitflow.ConnectionFactory(url, properties=json.loads(factory_props))
connection = factory.create_connection()
session = connection.create_session()
producer = session.create_producer(session.create_queue(queue))
result = {"error": None}
for n in range(1, 1001):
    started = time.monotonic()
    try:
        producer.send(session.create_text_message(str(n)))
    except rabbitflow.FlowControlTimeoutError as exc:
        result = {"error": str(exc), "waited_s": time.monotonic() - started}
        break
print(json.dumps(result), flush=True)
# The message nacked by the full queue stays pending for re-send, and closing
# is not what these tests are about: leave without waiting on it.
os._exit(0)
"""


def _full_queue(url: str, name: str) -> None:
    declare_queue(url, name, {"x-max-length": 5, "x-overflow": "reject-publish"})
    publish_bodies(url, name, (b"filler" for _ in range(5)))


def _send_until_timeout(
    url: str,
    queue: str,
    opts: str,
    factory_properties: dict[str, Any] | None = None,
    system_properties: dict[str, Any] | None = None,
) -> dict[str, Any]:
    env = {**os.environ, "RABBITFLOW_OPTS": opts}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            url,
            queue,
            json.dumps(factory_properties or {}),
            json.dumps(system_properties or {}),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"script printed nothing (rc {done.returncode}): {done.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(lines[0])
    assert result["error"] is not None, "no send raised FlowControlTimeoutError"
    return result


def test_rabbitflow_opts_sets_the_wait_failure(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("opts")
    _full_queue(broker.url, queue)

    result = _send_until_timeout(broker.url, queue, "-Dqpid.flow_control_wait_failure=2000")

    assert result["error"] == (
        "Unable to send message for 2 seconds due to broker enforced flow control"
    )
    # About 2 s, and far from the 60 s default: a behaviour check, not a speed test.
    assert 1.5 <= result["waited_s"] < 30, result


def test_factory_property_overrides_rabbitflow_opts(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("override")
    _full_queue(broker.url, queue)

    result = _send_until_timeout(
        broker.url,
        queue,
        "-Dqpid.flow_control_wait_failure=2000",
        factory_properties={"qpid.flow_control_wait_failure": 4000},
    )

    assert result["error"] == (
        "Unable to send message for 4 seconds due to broker enforced flow control"
    )
    # Longer than the 2 s RABBITFLOW_OPTS asked for: the factory's value won.
    assert 3.5 <= result["waited_s"] < 30, result


def test_system_properties_override_rabbitflow_opts(
    broker: Broker, new_queue: Callable[[str], str]
) -> None:
    queue = new_queue("sysprops")
    _full_queue(broker.url, queue)

    result = _send_until_timeout(
        broker.url,
        queue,
        "-Dqpid.flow_control_wait_failure=2000",
        system_properties={"qpid.flow_control_wait_failure": "4000"},
    )

    assert result["error"] == (
        "Unable to send message for 4 seconds due to broker enforced flow control"
    )
    assert 3.5 <= result["waited_s"] < 30, result
