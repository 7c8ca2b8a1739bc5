"""Build hook: compile the gateway's hot path with mypyc into the wheel.

Everything else about the distribution is declared in pyproject.toml; this
file only adds the compiled modules (``rabbitflow_broker.accel.MODULES``)
when a wheel is built, the way mypy (``MYPY_USE_MYPYC``) and black
(hatch-mypyc) build theirs:

* ``python -m build`` / ``pip wheel .`` / ``pip install .`` on a machine with
  a C compiler and Python's headers: a platform wheel holding the compiled
  engine beside its sources, plus a stamp of the sources it was built from;
* no C compiler, or ``RABBITFLOW_PURE_PYTHON=1`` at build time: a
  pure-Python wheel (``py3-none-any``) and a warning saying why; the gateway
  then runs the same engine from its sources;
* ``pip install -e .`` compiles in place (``scripts/build_accel.py`` does the
  same without reinstalling).

mypyc comes from the build requirements (``mypy`` in pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "broker_plugin"
PACKAGE = SRC / "rabbitflow_broker"
#: Commands that build extension modules; metadata and sdist commands
#: (egg_info, dist_info, sdist) never run mypyc.
_BUILDING = frozenset(
    {"bdist_wheel", "build", "build_ext", "editable_wheel", "install", "develop", "bdist"}
)


def load_accel() -> ModuleType:
    """``rabbitflow_broker.accel`` loaded from its file (stdlib only), so the
    build needs none of the package's dependencies."""
    spec = importlib.util.spec_from_file_location("_rabbitflow_build_accel", PACKAGE / "accel.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def warn(text: str) -> None:
    bar = "*" * 78
    print(f"\n{bar}\nrabbitflow: {text}\n{bar}\n", file=sys.stderr, flush=True)


def compiler_problem() -> str | None:
    """Why C extensions cannot be built here, or None when they can."""
    from setuptools._distutils import ccompiler, errors
    from setuptools._distutils import sysconfig as dsysconfig

    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return (
            f"Python's C headers are missing ({include}/Python.h; e.g. apt-get install python3-dev)"
        )
    compiler: Any = ccompiler.new_compiler()
    dsysconfig.customize_compiler(compiler)
    with tempfile.TemporaryDirectory(prefix="rabbitflow-cc-") as tmp:
        probe = os.path.join(tmp, "probe.c")
        with open(probe, "w") as handle:
            handle.write("#include <Python.h>\nint rabbitflow_probe(void) { return 0; }\n")
        try:
            compiler.compile([probe], output_dir=tmp, include_dirs=[include])
        except (
            errors.CompileError,
            errors.DistutilsExecError,
            errors.DistutilsPlatformError,
            OSError,
        ) as exc:
            return f"no working C compiler ({exc})"
    return None


def extensions(target_dir: str) -> list[Any]:
    """The mypyc extension modules, or [] (pure wheel) with a warning why.

    Raises:
        SystemExit: mypyc found type errors in the compiled modules.
    """
    if os.environ.get("RABBITFLOW_PURE_PYTHON", "") not in ("", "0"):
        warn("RABBITFLOW_PURE_PYTHON is set: building a pure-Python wheel (slower gateway)")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        warn(
            "mypyc is not installed (pip install mypy, or build with build isolation): "
            "building a pure-Python wheel; the gateway runs its engine as pure Python"
        )
        return []
    problem = compiler_problem()
    if problem is not None:
        warn(
            f"{problem}: building a pure-Python wheel; the gateway runs its engine as "
            "pure Python (about 1.5x the CPU per message)"
        )
        return []
    accel = load_accel()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return list(
            mypycify(
                [
                    # The project's mypy settings (strict, overrides); imports
                    # outside the compiled modules (aiohttp, pamqp) need not be
                    # installed at build time.
                    "--config-file=pyproject.toml",
                    "--follow-imports=silent",
                    *(
                        accel.source_path(name, PACKAGE).relative_to(ROOT).as_posix()
                        for name in accel.MODULES
                    ),
                ],
                group_name="rabbitflow_broker._accel",
                opt_level=opt_level(),
                target_dir=target_dir,
            )
        )
    finally:
        os.chdir(cwd)


#: The C compiler's optimisation level for the compiled engine: 3 (the
#: default) for every wheel and install a user runs.  A lower one compiles
#: several times faster (gcc took 14 s at 0 against 58 s at 3 on the main
#: generated file) and makes the engine slower: for builds that only check
#: the packaging, such as the wheel test's.
OPT_LEVEL_ENV = "RABBITFLOW_MYPYC_OPT_LEVEL"


def opt_level() -> str:
    """mypyc's ``opt_level``, from :data:`OPT_LEVEL_ENV` (``"3"`` when unset)."""
    level = os.environ.get(OPT_LEVEL_ENV, "").strip() or "3"
    if level not in ("0", "1", "2", "3"):
        raise SystemExit(f"{OPT_LEVEL_ENV} must be 0, 1, 2 or 3, got {level!r}")
    if level != "3":
        warn(f"{OPT_LEVEL_ENV}={level}: the engine is compiled at -O{level} (slower than -O3)")
    return level


def build_ext_class() -> type:
    """setuptools' build_ext, writing the accel stamp beside the extensions."""
    from setuptools.command.build_ext import build_ext

    class BuildExt(build_ext):  # type: ignore[misc]
        def run(self) -> None:
            accel = load_accel()
            want = accel.digest(PACKAGE)
            super().run()
            if not self.extensions:
                return
            if accel.digest(PACKAGE) != want:
                raise SystemExit("rabbitflow: the sources changed during the build; build again")
            targets = [Path(self.build_lib) / "rabbitflow_broker"]
            if self.inplace or getattr(self, "editable_mode", False):
                targets.append(PACKAGE)
            for target in targets:
                target.mkdir(parents=True, exist_ok=True)
                (target / accel.STAMP).write_text(want + "\n")

    return BuildExt


def main() -> None:
    from setuptools import setup

    ext_modules: list[Any] = []
    if _BUILDING.intersection(sys.argv[1:]):
        ext_modules = extensions(str(ROOT / "build" / "mypyc"))
    setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext_class()})


if __name__ == "__main__":
    main()
