"""setup.py's build hook: the engine is compiled when it can be, and the wheel
falls back to pure Python with a warning when it cannot."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_rabbitflow_setup_test", ROOT / "setup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the hook; setup() runs only as a script
    return module


def test_the_compiled_modules_are_accels_list(setup_py: ModuleType) -> None:
    from rabbitflow_broker import accel

    assert setup_py.load_accel().MODULES == accel.MODULES


def test_without_a_working_compiler_the_wheel_is_pure_and_says_why(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mypyc.build")
    monkeypatch.delenv("RABBITFLOW_PURE_PYTHON", raising=False)
    monkeypatch.setenv("CC", "/nonexistent/cc")

    assert setup_py.compiler_problem().startswith("no working C compiler")
    assert setup_py.extensions("unused") == []
    err = capsys.readouterr().err
    assert "no working C compiler" in err
    assert "building a pure-Python wheel" in err


def test_the_pure_switch_builds_a_pure_wheel(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RABBITFLOW_PURE_PYTHON", "1")

    assert setup_py.extensions("unused") == []
    assert "RABBITFLOW_PURE_PYTHON is set" in capsys.readouterr().err


def test_the_engine_is_compiled_at_o3_unless_asked_otherwise(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(setup_py.OPT_LEVEL_ENV, raising=False)
    assert setup_py.opt_level() == "3"
    assert capsys.readouterr().err == ""

    monkeypatch.setenv(setup_py.OPT_LEVEL_ENV, "0")
    assert setup_py.opt_level() == "0"
    assert "compiled at -O0 (slower than -O3)" in capsys.readouterr().err

    monkeypatch.setenv(setup_py.OPT_LEVEL_ENV, "fast")
    with pytest.raises(SystemExit, match="must be 0, 1, 2 or 3, got 'fast'"):
        setup_py.opt_level()
