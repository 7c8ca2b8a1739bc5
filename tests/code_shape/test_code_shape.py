"""The code's shape, measured: module and function length, access to other
modules' privates, import cycles, and what the pure engine imports.

Each check has an allowlist of the exceptions the tree had when the check
came in, each with its reason.  The lists may only shrink: a new exception
fails its test, and so does an entry that no longer applies or is larger
than what it allows (lower or remove it in the same change that fixes it).
"""

from __future__ import annotations

import ast

import pytest

from tests.code_shape.shape import (
    MAX_FUNCTION_LINES,
    MAX_MODULE_LINES,
    PACKAGES,
    import_cycles,
    long_functions,
    long_modules,
    private_accesses,
)

_SPLIT_LATER = "to be split by what it owns (the sub-package and client work)"
_PIPELINE = "the pipeline's plan-of-steps rework"

#: Modules over MAX_MODULE_LINES lines: path -> the most lines allowed, and why.
MODULES_ALLOWED: dict[str, tuple[int, str]] = {}

_HOT_LOOP = "the compiled hot loop, inlined on purpose: a call per frame costs more"
_PARSER = "one argument definition after another: long, not complex"

#: Functions over MAX_FUNCTION_LINES lines: path:name -> the most lines allowed, and why.
FUNCTIONS_ALLOWED: dict[str, tuple[int, str]] = {
    "broker_plugin/rabbitflow_broker/engine/from_client.py:FromClient._scan_client": (
        78,
        _HOT_LOOP,
    ),
    "broker_plugin/rabbitflow_broker/cli/config.py:build_parser": (108, _PARSER),
    "broker_plugin/rabbitflow_broker/cli/config_cli.py:build_parser": (127, _PARSER),
    "broker_plugin/rabbitflow_broker/hub/config.py:GatewayConfig.__post_init__": (
        84,
        "a validation per option; to move into per-option validators",
    ),
    "broker_plugin/rabbitflow_broker/cli/demo.py:_run_against": (146, _SPLIT_LATER),
    "broker_plugin/rabbitflow_broker/admin/metrics.py:GatewayCollector._queue_metrics": (
        63,
        _SPLIT_LATER,
    ),
    "broker_plugin/rabbitflow_broker/engine/routing.py:RoutingTable.route": (61, _SPLIT_LATER),
    "pipeline/rabbitflow_pipeline/cli.py:_parser": (64, _PARSER),
    "pipeline/rabbitflow_pipeline/generate.py:_block_client_lines": (65, _PIPELINE),
    "pipeline/rabbitflow_pipeline/generate.py:_queue_events": (69, _PIPELINE),
    "pipeline/rabbitflow_pipeline/generate.py:_store_events": (65, _PIPELINE),
    "pipeline/rabbitflow_pipeline/generate.py:_write_gateway": (71, _PIPELINE),
    "pipeline/rabbitflow_pipeline/generate.py:generate": (63, _PIPELINE),
    "pipeline/rabbitflow_pipeline/report.py:render_report": (83, _PIPELINE),
}


#: Modules touching privates they do not define: path -> the most accesses allowed, and why.
PRIVATES_ALLOWED: dict[str, tuple[int, str]] = {
    "broker_plugin/rabbitflow_broker/admin/api.py": (7, "the admin API reaching into the service"),
    "broker_plugin/rabbitflow_broker/cli/demo.py": (10, "the demo reaching into its workers"),
    "broker_plugin/rabbitflow_broker/engine/routing.py": (8, "the routing table and its exchanges"),
    "broker_plugin/rabbitflow_broker/engine/routing_exchange.py": (
        6,
        "the routing table's internals",
    ),
}

#: Import cycles (even under TYPE_CHECKING), each allowed to lose members, never to grow.
CYCLES_ALLOWED: list[tuple[frozenset[str], str]] = []

#: The pure engine: the sub-package ``rabbitflow_broker.engine``; none of its
#: modules imports a clock, an event loop or sockets.
ENGINE_MODULES = tuple(
    sorted(
        path.relative_to(PACKAGES["rabbitflow_broker"]).with_suffix("").as_posix()
        for path in (PACKAGES["rabbitflow_broker"] / "engine").glob("*.py")
    )
)
_IMPURE = frozenset({"time", "asyncio", "socket", "selectors", "threading"})


def _check(found: dict[str, int], allowed: dict[str, tuple[int, str]], what: str) -> None:
    new = {key: value for key, value in found.items() if value > allowed.get(key, (0, ""))[0]}
    assert not new, f"{what} (allowlist: {allowed.get(next(iter(new)), (0, 'none'))}): {new}"
    stale = {
        key: (limit, found.get(key, 0))
        for key, (limit, _) in allowed.items()
        if found.get(key, 0) < limit
    }
    assert not stale, f"lower these allowances (allowed, now): {stale}"


def test_no_module_is_over_600_lines() -> None:
    _check(long_modules(), MODULES_ALLOWED, f"modules over {MAX_MODULE_LINES} lines")


def test_no_function_is_over_60_lines() -> None:
    _check(long_functions(), FUNCTIONS_ALLOWED, f"functions over {MAX_FUNCTION_LINES} lines")


def test_no_module_touches_privates_it_does_not_define() -> None:
    _check(private_accesses(), PRIVATES_ALLOWED, "private attributes of other modules")


def test_no_import_cycle_even_under_type_checking() -> None:
    allowed = [cycle for cycle, _ in CYCLES_ALLOWED]
    new = [sorted(cycle) for cycle in import_cycles() if not any(cycle <= a for a in allowed)]
    assert not new, f"import cycles: {new}"


@pytest.mark.parametrize("name", ENGINE_MODULES)
def test_the_engine_imports_no_clock_loop_or_socket(name: str) -> None:
    path = PACKAGES["rabbitflow_broker"] / f"{name}.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.partition(".")[0])
    assert not imported & _IMPURE, f"{name} imports {sorted(imported & _IMPURE)}"
