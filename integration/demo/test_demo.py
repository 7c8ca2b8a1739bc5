"""rabbitflow-demo against the shared RabbitMQ (issue 3 item 8)."""

from __future__ import annotations

import io
import re

import pytest

from integration.broker.conftest import RunningGateway
from integration.conftest import Broker
from rabbitflow_broker.cli.demo import DemoOptions, main, run
from rabbitflow_broker.server.rabbitmq_node import free_port

BOUND = 100 + 50 + 15


def summary(out: str) -> dict[str, str]:
    lines = out.split("\nSummary\n", 1)[1].splitlines()
    return {line[:24].strip(): line[24:].strip() for line in lines if line.startswith("  ")}


@pytest.mark.slow
def test_demo_with_its_own_gateway_stays_under_the_bound_and_delivers_exactly_once(
    broker: Broker,
) -> None:
    out = io.StringIO()

    result = run(
        DemoOptions(
            messages=200,
            consume_rate=400,
            rabbitmq_url=broker.url,
            management_url=broker.management_url,
        ),
        out=out,
    )

    assert result.problems == [], out.getvalue()
    assert 100 < result.peak <= BOUND
    assert result.events["QUE-1003"] >= 1
    assert result.events["QUE-1004"] >= 1
    assert result.events["CHN-1005"] >= 2
    assert result.flow_stopped_count == result.events["QUE-1003"]
    assert (result.received, result.in_order) == (400, True)
    assert all(p.sent == 200 and p.waited_s > 0 for p in result.producers)


@pytest.mark.slow
def test_demo_console_script_prints_a_summary_and_exits_0(
    broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--messages", "150", "--consume-rate", "400", "--rabbitmq-url", broker.url]
    if broker.management_url:
        argv += ["--management-url", broker.management_url]

    code = main(argv)

    out = capsys.readouterr().out
    assert code == 0, out
    shown = summary(out)
    assert shown["peak depth"].endswith(f"(bound {BOUND}): OK")
    assert int(shown["peak depth"].split()[0]) <= BOUND
    assert "QUE-1003" in shown["events"]
    assert "QUE-1004" in shown["events"]
    assert shown["exactly once, in order"] == "OK"
    assert shown["consumer"] == "received 300 of 300"


@pytest.mark.slow
def test_demo_against_a_running_gateway_reports_transitions_from_the_admin_api(
    gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--messages", "150", "--consume-rate", "400", "--gateway-url", gateway.url]
    argv += ["--admin-url", f"http://127.0.0.1:{gateway.admin_port}"]

    code = main(argv)

    out = capsys.readouterr().out
    assert code == 0, out
    shown = summary(out)
    assert "QUE-1003" in shown["events"]
    assert shown["exactly once, in order"] == "OK"
    # The demo queue is gone afterwards.
    assert not any(
        q["name"].startswith("rabbitflow-demo-") for q in gateway.http("GET", "/api/queues")[1]
    )


@pytest.mark.slow
def test_demo_starts_a_throwaway_rabbitmq_when_none_answers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nobody = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"

    code = main(["--messages", "120", "--consume-rate", "400", "--rabbitmq-url", nobody])

    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err  # the demo's error goes to stderr
    assert "starting a throwaway node" in out
    assert summary(out)["exactly once, in order"] == "OK"


@pytest.mark.slow
def test_demo_output_is_about_a_screen_per_phase_and_names_producers_one_way(
    broker: Broker,
) -> None:
    out = io.StringIO()

    result = run(
        DemoOptions(
            messages=500,
            consume_rate=200,
            rabbitmq_url=broker.url,
            management_url=broker.management_url,
        ),
        out=out,
    )

    text = out.getvalue()
    assert result.problems == [], text
    story, summary_part = text.split("\nSummary\n", 1)
    phases = story.split("\nPhase ")[1:]
    assert [p.split(":", 1)[0] for p in phases] == ["1", "2", "3"], text
    assert all(len(p.splitlines()) <= 40 for p in phases), text
    labels = {"producer A (capacity 50)", "producer B (capacity 15)"}
    named_in_log = set(re.findall(r"\[(producer [^\]]*)\]", story))
    named_in_summary = {label for label in labels if f"  {label}  sent" in summary_part}
    assert named_in_log == labels
    assert named_in_summary == labels
