"""Compile the connection engine's hot path with mypyc (see rabbitflow_broker.accel).

    .venv/bin/python scripts/build_accel.py          # build (about a minute)
    .venv/bin/python scripts/build_accel.py --check  # exit 0 when the build is current
    .venv/bin/python scripts/build_accel.py --clean  # remove it: pure Python again

The extension modules land beside their sources in
broker_plugin/rabbitflow_broker/ (ignored by git) with a stamp of the
sources they were built from; a source edited later makes the package
import the pure-Python sources again until the next build.  Needs mypy
(the test extra) and a C compiler; without them the gateway runs pure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "broker_plugin"
PACKAGE = SRC / "rabbitflow_broker"
sys.path.insert(0, str(SRC))

from rabbitflow_broker import accel  # noqa: E402


def clean() -> None:
    for path in [*accel.extension_paths(PACKAGE), PACKAGE / accel.STAMP]:
        path.unlink(missing_ok=True)


def build() -> None:
    from mypyc.build import mypycify  # the test extra's mypy brings mypyc
    from setuptools import setup

    clean()
    want = accel.digest(PACKAGE)
    with tempfile.TemporaryDirectory(prefix="rabbitflow-accel-") as tmp, contextlib.chdir(SRC):
        extensions = mypycify(
            [f"rabbitflow_broker/{name}.py" for name in accel.MODULES],
            group_name="rabbitflow_broker._accel",
            opt_level="3",
            target_dir=os.path.join(tmp, "c"),
        )
        setup(
            name="rabbitflow-accel",
            ext_modules=extensions,
            script_args=[
                "-q",
                "build_ext",
                "--inplace",
                "--build-temp",
                os.path.join(tmp, "o"),
                "--build-lib",
                os.path.join(tmp, "lib"),
            ],
        )
    if accel.digest(PACKAGE) != want:
        clean()
        raise SystemExit("the sources changed during the build; run it again")
    (PACKAGE / accel.STAMP).write_text(want + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 0 when the build is current")
    group.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    if args.check:
        return 0 if accel.current_build(PACKAGE) else 1
    if args.clean:
        clean()
        return 0
    build()
    return 0


if __name__ == "__main__":
    sys.exit(main())
