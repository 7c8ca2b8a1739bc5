"""Measures of the code's shape, read from the sources with :mod:`ast`.

Used by ``test_code_shape.py``: module length, function length, attribute
access to another module's privates, and import cycles (counting imports
under ``if TYPE_CHECKING:`` and inside functions), in the three packages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: package name -> its directory.
PACKAGES = {
    "rabbitflow": ROOT / "client" / "rabbitflow",
    "rabbitflow_broker": ROOT / "broker_plugin" / "rabbitflow_broker",
    "rabbitflow_pipeline": ROOT / "pipeline" / "rabbitflow_pipeline",
}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def modules() -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every module of the packages."""
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _label(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def long_modules() -> dict[str, int]:
    """Modules over :data:`MAX_MODULE_LINES` lines: path -> lines."""
    found = {}
    for _, path in modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found[_label(path)] = lines
    return found


def long_functions() -> dict[str, int]:
    """Functions over :data:`MAX_FUNCTION_LINES` lines (decorators and
    docstring included): ``path:qualified name`` -> lines."""
    found = {}
    for _, path in modules():
        for name, node in _functions(_tree(path)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found[f"{_label(path)}:{name}"] = lines
    return found


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            yield name, child
            yield from _functions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.Module) -> set[str]:
    """Private names the module itself defines: functions, classes,
    assignments, attributes it sets on ``self`` or ``cls``, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, setattr names
    return {name for name in names if _private(name)}


def private_accesses() -> dict[str, int]:
    """Per module, how often it reads or writes a private attribute it does
    not define itself (``other._name``, ``from x import _name``): path -> count.
    ``self._x`` and ``cls._x`` count when the module defines no ``_x``
    (a mixin reaching into the class it is mixed into)."""
    found = {}
    for _, path in modules():
        tree = _tree(path)
        own = _own_names(tree)
        count = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                count += 1
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                count += sum(1 for alias in node.names if _private(alias.name))
        if count:
            found[_label(path)] = count
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the packages that ``name`` imports, wherever in it
    (at the top, under ``TYPE_CHECKING``, inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # ``from package import module`` imports the module, not what the
            # package's __init__ holds.
            names = [f"{base}.{alias.name}" for alias in node.names]
            targets = [n for n in names if n in known]
            if len(targets) < len(names):
                targets.append(base)
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the packages it imports."""
    paths = dict(modules())
    known = set(paths)
    return {name: _imports(name, path, known) for name, path in paths.items()}


def import_cycles() -> list[frozenset[str]]:
    """The import cycles: strongly connected components of more than one
    module (Tarjan), each as the set of its modules, sorted."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles, key=sorted)
