"""The console scripts' entry points: name a missing extra instead of a traceback.

``rabbitflow-broker`` and ``rabbitflow-demo`` need the ``broker`` extra,
``rabbitflow-analyze`` the ``pipeline`` extra.  Installed without it, each
says which extra to install (``pip install 'rabbitflow[broker]'``) and exits
1, for ``--help`` too; ``--version`` still answers.  Only the standard
library is imported before the check.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

__all__ = ["EXTRAS", "Entry", "analyze", "broker", "demo", "missing_modules"]

#: A console script's entry point: argv (None: ``sys.argv[1:]``) -> exit status.
Entry = Callable[[Sequence[str] | None], int]

#: The modules each extra brings that its console scripts import.
EXTRAS: dict[str, tuple[str, ...]] = {
    "broker": ("aiohttp", "pamqp", "prometheus_client"),
    "pipeline": ("pyspark", "pyarrow"),
}
EXIT_MISSING_EXTRA = 1


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def _version() -> str:
    try:
        return version("rabbitflow")
    except PackageNotFoundError:
        return "0+unknown"


def _run(prog: str, extra: str, target: str, argv: Sequence[str] | None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    missing = missing_modules(extra)
    if missing:
        if "--version" in args:
            print(f"{prog} {_version()}")
            return 0
        print(
            f"{prog}: needs the '{extra}' extra, which is not installed "
            f"(no module {', '.join(missing)}): pip install 'rabbitflow[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    module_name, _, function = target.partition(":")
    main = getattr(importlib.import_module(module_name), function)
    code: int = main(args)
    return code


def broker(argv: Sequence[str] | None = None) -> int:
    """``rabbitflow-broker``."""
    return _run("rabbitflow-broker", "broker", "rabbitflow_broker.cli.broker:main", argv)


def demo(argv: Sequence[str] | None = None) -> int:
    """``rabbitflow-demo``."""
    return _run("rabbitflow-demo", "broker", "rabbitflow_broker.cli.demo:main", argv)


def analyze(argv: Sequence[str] | None = None) -> int:
    """``rabbitflow-analyze``."""
    return _run("rabbitflow-analyze", "pipeline", "rabbitflow_pipeline.cli:main", argv)
