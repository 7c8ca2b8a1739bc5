"""``GET /metrics`` passes promlint (the rules of ``promtool check metrics``),
serves process metrics and ``rabbitflow_build_info``, keeps the deprecated
names for one release, and speaks OpenMetrics when the scraper asks."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections.abc import Callable

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

import rabbitflow_broker
from rabbitflow_broker import accel
from rabbitflow_broker.admin.metrics import metrics_registry, render
from rabbitflow_broker.server.service import GatewayService
from tests.admin.conftest import Serve

#: promlint's lintMetricUnits: units that are not base units.
NON_BASE_UNITS = (
    "milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "weeks",
    "months", "years", "kilobytes", "megabytes", "gigabytes", "terabytes", "petabytes",
    "kibibytes", "mebibytes", "gibibytes", "bits", "percent", "celsius", "fahrenheit",
    "kelvin",
)  # fmt: skip
#: promlint's lintUnitAbbreviations.
ABBREVIATIONS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def promlint(text: str) -> list[str]:
    """The problems ``promtool check metrics`` reports for ``text`` (its rules:
    help, counter and reserved suffixes, units, abbreviations, camel case,
    reserved characters)."""
    helps = set(re.findall(r"^# HELP (\S+) ", text, flags=re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
    labels = set(re.findall(r"[{,]([a-zA-Z_][a-zA-Z0-9_]*)=", text))
    problems: list[str] = []
    for name, kind in types.items():
        if name not in helps:
            problems.append(f"{name}: no help text")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f'{name}: counter metrics should have "_total" suffix')
        if kind != "counter" and name.endswith("_total"):
            problems.append(f'{name}: non-counter metrics should not have "_total" suffix')
        if kind != "untyped":
            if kind != "histogram" and name.endswith("_bucket"):
                problems.append(f'{name}: non-histogram metrics should not have "_bucket"')
            for suffix in ("_count", "_sum"):
                if kind not in ("histogram", "summary") and name.endswith(suffix):
                    problems.append(
                        f'{name}: non-histogram and non-summary metrics should not have "{suffix}"'
                    )
        parts = name.split("_")
        problems += [
            f"{name}: use base unit instead of {u!r}" for u in NON_BASE_UNITS if u in parts
        ]
        problems += [f"{name}: abbreviated unit {a!r}" for a in ABBREVIATIONS if a in parts]
        if not NAME.match(name) or ":" in name:
            problems.append(f"{name}: reserved characters")
        if name != name.lower():
            problems.append(f"{name}: camelCase")
    problems += [f"label {label}: camelCase" for label in labels if label != label.lower()]
    return problems


def _busy_service(make_service: Callable[..., GatewayService]) -> GatewayService:
    service = make_service(store_overfull_size=1000, store_underfull_size=500)
    gateway = service.gateway
    gateway.queue_declared("/", "orders", {"qpid.flow_stop_count": 3, "qpid.flow_resume_count": 1})
    for _ in range(4):
        gateway.published("/", frozenset({"orders"}), 100)
    gateway.store_quotas.observe("/", 1500, "management")
    return service


def test_the_lint_rules_catch_what_promlint_catches() -> None:
    bad = (
        "# HELP a_count x\n# TYPE a_count gauge\na_count 1\n"
        "# HELP b x\n# TYPE b counter\nb 1\n"
        "# TYPE c_milliseconds gauge\nc_milliseconds 1\n"
    )
    problems = promlint(bad)

    assert any("a_count" in p and '"_count"' in p for p in problems)
    assert any("b: counter" in p for p in problems)
    assert any("c_milliseconds: no help" in p for p in problems)
    assert any("c_milliseconds: use base unit" in p for p in problems)


def test_metrics_pass_promlint(make_service: Callable[..., GatewayService]) -> None:
    text = render(metrics_registry(_busy_service(make_service).gateway)).decode()

    assert list(text_string_to_metric_families(text))  # prometheus-client parses it
    assert promlint(text) == []


def test_metrics_pass_promtool(make_service: Callable[..., GatewayService]) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: scripts/bootstrap installs it (package prometheus)")
    text = render(metrics_registry(_busy_service(make_service).gateway))

    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr


def _values(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue", "orders") == "orders"
    }


def test_new_names_and_the_deprecated_aliases_carry_the_same_values(
    make_service: Callable[..., GatewayService],
) -> None:
    text = render(metrics_registry(_busy_service(make_service).gateway)).decode()
    values = _values(text)

    assert values["rabbitflow_queue_flow_stop_messages"] == 3
    assert values["rabbitflow_queue_flow_resume_messages"] == 1
    assert values["rabbitflow_queue_flow_stop_count"] == 3
    assert values["rabbitflow_queue_flow_resume_count"] == 1
    assert "# HELP rabbitflow_queue_flow_stop_count Deprecated: use " in text
    assert "# TYPE rabbitflow_queue_flow_stop_count untyped" in text


def test_process_metrics_and_build_info_are_served(
    make_service: Callable[..., GatewayService],
) -> None:
    text = render(metrics_registry(_busy_service(make_service).gateway)).decode()
    values = _values(text)

    assert values["process_resident_memory_bytes"] > 0
    assert values["process_cpu_seconds_total"] > 0
    assert values["process_open_fds"] > 0
    engine = "mypyc" if accel.status().startswith("compiled") else "pure"
    info = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rabbitflow_build_info"
    ]
    assert [(s.labels, s.value) for s in info] == [
        (
            {
                "version": rabbitflow_broker.__version__,
                "engine": engine,
                "python": platform.python_version(),
            },
            1.0,
        )
    ]


@pytest.mark.asyncio
async def test_openmetrics_when_the_scraper_asks_for_it(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = _busy_service(make_service)
    accept = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"

    async with serve(service) as client:
        response = await client.get("/metrics", headers={"Accept": accept})
        text = await response.text()
        plain = await client.get("/metrics")
        plain_type = plain.headers["Content-Type"]

    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["rabbitflow_queue_flow_stops"].type == "counter"
    assert families["rabbitflow_queue_flow_stop_messages"].samples[0].value == 3
    assert plain_type.startswith("text/plain; version=0.0.4")
