"""Build the ``--py-files`` zip that ships the pipeline to Spark executors.

    python -m rabbitflow_pipeline.package dist/rabbitflow_pipeline.zip

The zip holds ``rabbitflow_pipeline`` and, from the gateway, only
``rabbitflow_broker/events.py`` (the schema's source) under a minimal
``rabbitflow_broker/__init__.py``: the gateway package's own ``__init__``
imports the whole server (aiohttp, pamqp …), which executors do not need.
The sink additionally needs ``rabbitflow`` and its dependencies installed
on the executors (or shipped as a wheel).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import rabbitflow_broker.events
import rabbitflow_pipeline

__all__ = ["build_py_files", "main"]

_BROKER_INIT = '"""rabbitflow_broker, reduced to its event classes for Spark executors."""\n'


def build_py_files(target: Path) -> Path:
    """Write the zip to ``target`` (parents created); returns it.

    Raises:
        OSError: the zip cannot be written.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    package_dir = Path(rabbitflow_pipeline.__file__).parent
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(package_dir.glob("*.py")):
            archive.write(source, f"rabbitflow_pipeline/{source.name}")
        archive.writestr("rabbitflow_broker/__init__.py", _BROKER_INIT)
        archive.write(rabbitflow_broker.events.__file__, "rabbitflow_broker/events.py")
    return target


def main(argv: list[str] | None = None) -> int:
    """Command line entry: ``python -m rabbitflow_pipeline.package ZIP``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rabbitflow_pipeline.package ZIP", file=sys.stderr)
        return 2
    print(build_py_files(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
