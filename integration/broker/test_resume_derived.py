"""A resume value that is not set is derived from its stop value on every path.

Each test sets a lone stop value (resume 0 or absent) one way — declare
arguments, ``PUT …/flow``, ``rabbitflow-config set-flow``, broker defaults
with a resume percentage of 0 — fills the queue past it through the gateway
with a confirming producer, drains it to empty, and checks the queue is OFF
again with QUE-1004 and CHN-1006 logged.  Also: Qpid's own queue arguments
(``qpid.max_count``, ``qpid.max_size``, ``qpid.policy_type=ring``) as the
admin API shows them.
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from integration.broker._producers import WindowProducer, wait_done
from integration.broker.conftest import RunningGateway, wait_for
from rabbitflow_broker.cli.config_cli import main as config_cli
from rabbitflow_broker.server.persistence import RabbitMQThresholdStore

STOP = 20
DERIVED_RESUME = STOP * 70 // 80  # the default percentages, 80 and 70


@pytest.fixture
def queue(
    unique_name: Callable[[str], str],
    cleanup_queues: list[str],
    broker: Any,
) -> Iterator[str]:
    """A unique queue name; its queue and any stored thresholds go afterwards."""
    name = unique_name("resume")
    cleanup_queues.append(name)
    yield name
    parameter = RabbitMQThresholdStore.parameter_name(("/", name))
    request = urllib.request.Request(
        f"{broker.management_url or 'http://127.0.0.1:15672'}/api/global-parameters/"
        f"{quote(parameter, safe='')}",
        method="DELETE",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
    )
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=10).close()


def _declare(gateway: RunningGateway, name: str, arguments: dict[str, Any] | None) -> None:
    connection = gateway.connect()
    connection.channel().queue_declare(name, arguments=arguments)
    connection.close()


def _drain(gateway: RunningGateway, name: str, expected: int) -> int:
    connection = gateway.connect()
    channel = connection.channel()
    taken = 0
    for method, _props, _body in channel.consume(name, auto_ack=True, inactivity_timeout=30):
        assert method is not None, f"only {taken} of {expected} messages arrived"
        taken += 1
        if taken == expected:
            break
    channel.cancel()
    connection.close()
    return taken


def _fill_past_stop_then_drain(gateway: RunningGateway, name: str) -> dict[str, Any]:
    """Fill ``name`` until it is flow-stopped, drain it to empty; the final admin view."""
    producer = WindowProducer(gateway.url, name, pid="p", count=None, capacity=5)
    producer.start()
    try:
        wait_for(
            lambda: gateway.queue(name)["flowStopped"] and producer.flowed,
            what="queue flow-stopped and the producer's channel flowed",
        )
        producer.count = producer.sent
        assert gateway.queue(name)["messages"] > STOP
        _drain(gateway, name, producer.count)
        wait_done(producer, timeout=30)
    finally:
        producer.stop()
        producer.join(timeout=10)
    assert producer.confirmed == producer.count
    return wait_for(lambda: (q := gateway.queue(name))["messages"] == 0 and q, what="queue drained")


def _assert_resumed(gateway: RunningGateway, name: str, final: dict[str, Any]) -> None:
    assert final["flowStopped"] is False
    assert final["flowStoppedCount"] == 1
    assert len(gateway.events("QUE-1003", name)) == 1
    assert len(gateway.events("QUE-1004", name)) == 1
    enforced = {(e["connection"], e["channel"]) for e in gateway.events("CHN-1005", name)}
    removed = {(e["connection"], e["channel"]) for e in gateway.events("CHN-1006")}
    assert enforced
    assert enforced <= removed


def test_declared_resume_zero_is_derived_and_the_drained_queue_resumes(
    gateway: RunningGateway, queue: str
) -> None:
    _declare(gateway, queue, {"qpid.flow_stop_count": STOP, "qpid.flow_resume_count": 0})
    info = gateway.queue(queue)
    assert (info["flowStopCount"], info["flowResumeCount"]) == (STOP, DERIVED_RESUME)

    _assert_resumed(gateway, queue, _fill_past_stop_then_drain(gateway, queue))


def test_put_flow_with_resume_zero_is_derived_and_the_drained_queue_resumes(
    gateway: RunningGateway, queue: str
) -> None:
    _declare(gateway, queue, None)
    status, body = gateway.http(
        "PUT",
        f"/api/queues/%2F/{quote(queue)}/flow",
        {"flowStopCount": STOP, "flowResumeCount": 0},
    )
    assert status == 200, body
    assert (body["flowStopCount"], body["flowResumeCount"]) == (STOP, DERIVED_RESUME)

    _assert_resumed(gateway, queue, _fill_past_stop_then_drain(gateway, queue))


def test_set_flow_stop_alone_gets_a_resume_and_the_drained_queue_resumes(
    gateway: RunningGateway, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _declare(gateway, queue, None)  # default size thresholds only: no resume count
    code = config_cli(
        [
            "--admin-url",
            f"http://127.0.0.1:{gateway.admin_port}",
            "--gateway-url",
            gateway.url,
            "set-flow",
            queue,
            "--flow-stop-count",
            str(STOP),
        ],
        environ={},
    )
    assert code == 0, capsys.readouterr().err
    info = gateway.queue(queue)
    assert (info["flowStopCount"], info["flowResumeCount"]) == (STOP, DERIVED_RESUME)

    _assert_resumed(gateway, queue, _fill_past_stop_then_drain(gateway, queue))


def test_broker_resume_percentage_zero_is_derived_and_the_drained_queue_resumes(
    gateway_factory: Callable[..., RunningGateway], queue: str
) -> None:
    gateway = gateway_factory(default_flow_stop_threshold=80, default_flow_resume_threshold=0)
    _declare(gateway, queue, {"x-max-length": 25, "x-overflow": "reject-publish"})
    info = gateway.queue(queue)
    assert (info["flowStopCount"], info["flowResumeCount"], info["source"]) == (
        STOP,
        DERIVED_RESUME,
        "default",
    )

    _assert_resumed(gateway, queue, _fill_past_stop_then_drain(gateway, queue))


# -- Qpid's own queue arguments ---------------------------------------------------


def _thresholds(info: dict[str, Any]) -> tuple[int, int, int, int, str]:
    return (
        info["flowStopCount"],
        info["flowResumeCount"],
        info["flowStopSize"],
        info["flowResumeSize"],
        info["source"],
    )


def test_qpid_max_count_gives_count_defaults_through_the_admin_api(
    gateway: RunningGateway, queue: str
) -> None:
    _declare(gateway, queue, {"qpid.max_count": 1000})
    assert _thresholds(gateway.queue(queue)) == (800, 700, 0, 0, "default")


def test_qpid_max_size_gives_size_defaults_through_the_admin_api(
    gateway: RunningGateway, queue: str
) -> None:
    _declare(gateway, queue, {"qpid.max_size": 10_000})
    assert _thresholds(gateway.queue(queue)) == (0, 0, 8000, 7000, "default")


def test_qpid_ring_policy_gets_no_defaults_through_the_admin_api(
    gateway: RunningGateway, queue: str
) -> None:
    _declare(gateway, queue, {"qpid.max_count": 1000, "qpid.policy_type": "ring"})
    assert _thresholds(gateway.queue(queue)) == (0, 0, 0, 0, "none")
