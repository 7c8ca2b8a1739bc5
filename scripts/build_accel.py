"""Compile the connection engine's hot path in place (see rabbitflow_broker.accel).

    .venv/bin/python scripts/build_accel.py          # build (about a minute)
    .venv/bin/python scripts/build_accel.py --check  # exit 0 when the build is current
    .venv/bin/python scripts/build_accel.py --clean  # remove it: pure Python again

The same build as the wheel's (setup.py), for a checkout: the extension
modules land beside their sources in broker_plugin/rabbitflow_broker/
(ignored by git) with a stamp of the sources they were built from; a source
edited later makes the package import the pure-Python sources again until
the next build.  Needs mypy (the dev dependency group) and a C compiler;
without them the gateway runs pure.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_rabbitflow_setup", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the build; setup() runs only as a script
    return module


def clean(setup_py: ModuleType) -> None:
    accel = setup_py.load_accel()
    package = setup_py.PACKAGE
    for path in [*accel.extension_paths(package), package / accel.STAMP]:
        path.unlink(missing_ok=True)


def build(setup_py: ModuleType) -> int:
    from setuptools import setup

    clean(setup_py)
    with tempfile.TemporaryDirectory(prefix="rabbitflow-accel-") as tmp:
        extensions = setup_py.extensions(str(Path(tmp) / "c"))
        if not extensions:
            return 1
        # In broker_plugin/: no pyproject.toml there to merge into this setup().
        with contextlib.chdir(setup_py.SRC):
            setup(
                name="rabbitflow-accel",
                ext_modules=extensions,
                cmdclass={"build_ext": setup_py.build_ext_class()},
                script_args=[
                    "-q",
                    "build_ext",
                    "--inplace",
                    "--build-temp",
                    str(Path(tmp) / "o"),
                    "--build-lib",
                    str(Path(tmp) / "lib"),
                ],
            )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 0 when the build is current")
    group.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    setup_py = _setup_module()
    if args.check:
        return 0 if setup_py.load_accel().current_build(setup_py.PACKAGE) else 1
    if args.clean:
        clean(setup_py)
        return 0
    return build(setup_py)


if __name__ == "__main__":
    sys.exit(main())
