"""The wheel as a user gets it: built from a clean export, installed outside the tree.

One module-scoped build: ``git archive HEAD`` is unpacked into a temporary
directory and ``python -m build`` makes the sdist and, from the sdist, the
wheel (build isolation: setuptools and mypy come from pip's cache after
the first run), with the engine compiled at the C compiler's ``-O0``
(``RABBITFLOW_MYPYC_OPT_LEVEL``): the same wheel as a user's but for the
speed of the compiled code, which nothing here measures.  Then

* a fresh virtualenv gets the wheel with ``[broker]``; ``rabbitflow-broker``
  runs from it in front of the shared RabbitMQ, in a directory outside the
  source tree, and its own memory map shows the compiled engine loaded
  from that virtualenv;
* a second fresh virtualenv gets the bare wheel: ``import rabbitflow``
  works, and the gateway's and the analyzer's commands name their extra
  without a traceback.

The virtualenvs are made without pip (``--without-pip``); this process's
pip installs into them (``pip --python``), which saves a pip bootstrap per
venv.  Slow (a mypyc build and two installs): ``slow``.
"""

from __future__ import annotations

import importlib.machinery
import io
import os
import platform
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import amqp_handshake_ok, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/PID/maps"),
    pytest.mark.timeout(1200),
]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _env() -> dict[str, str]:
    """This environment without anything pointing into the source tree."""
    drop = {"PYTHONPATH", "RABBITFLOW_PURE_PYTHON", "VIRTUAL_ENV", "PIP_NO_CACHE_DIR"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(
    *command: str | Path, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, command))} failed ({done.returncode}):\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def _venv(path: Path, requirement: str, cwd: Path) -> Path:
    """A fresh virtualenv at ``path`` with ``requirement`` installed; its bin dir."""
    _run(sys.executable, "-m", "venv", "--without-pip", path, cwd=cwd, timeout=120)
    python = path / "bin" / "python"
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--no-compile",
        requirement,
        cwd=cwd,
    )
    return path / "bin"


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the source tree."""
    path = tmp_path_factory.mktemp("user")
    assert not path.resolve().is_relative_to(ROOT)
    return path


def _export(directory: Path) -> Path:
    """A clean ``git archive`` of HEAD unpacked into ``directory``."""
    directory.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    assert not list(directory.rglob("*.so")), "the export holds no build"
    return directory


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel ``python -m build`` makes from a clean ``git archive`` of HEAD."""
    pytest.importorskip("build", reason="the test extra's build")
    work = tmp_path_factory.mktemp("build")
    source = _export(work / "source")
    started = time.monotonic()
    # At the C compiler's -O0: what this module checks is the packaging (the
    # compiled modules are in the wheel, installed and loaded), which the
    # optimisation level does not change, and -O0 compiles several times faster.
    _run(
        sys.executable,
        "-m",
        "build",
        "--outdir",
        work / "dist",
        source,
        cwd=work,
        env={"RABBITFLOW_MYPYC_OPT_LEVEL": "0"},
    )
    sys.stderr.write(f"sdist and wheel built in {time.monotonic() - started:.0f} s\n")
    return work / "dist"


def test_without_a_compiler_the_wheel_is_pure_and_the_build_says_so(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the test extra's build")
    source = _export(tmp_path / "source")
    env = {**_env(), "CC": str(tmp_path / "no-such-cc")}

    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(source)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )

    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert [w.name for w in (tmp_path / "dist").glob("*.whl")] == [
        f"rabbitflow-{VERSION}-py3-none-any.whl"
    ]
    assert "no working C compiler" in built.stdout + built.stderr
    assert "building a pure-Python wheel" in built.stdout + built.stderr


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (built,) = dist.glob("rabbitflow-*.whl")
    return built


def test_the_sdist_holds_what_the_build_needs(dist: Path) -> None:
    (sdist,) = dist.glob("rabbitflow-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"setup.py", "pyproject.toml", "LICENSE", "README.md"} <= names
    assert "broker_plugin/rabbitflow_broker/accel.py" in names
    assert not [n for n in names if n.endswith((".so", ".c", "_accel.stamp"))]


def test_the_wheel_is_a_platform_wheel_with_the_compiled_engine(wheel: Path) -> None:
    import zipfile

    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{python_tag}-{python_tag}-" in wheel.name, wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rabbitflow_broker/_accel.stamp" in names
    assert any(n.startswith("rabbitflow_broker/engine/connection.cpython-") for n in names)
    assert any(n.endswith("/licenses/LICENSE") for n in names)
    assert "rabbitflow_broker/engine/connection.py" in names  # the pure fallback ships too


@pytest.fixture(scope="module")
def broker_venv(wheel: Path, outside: Path) -> Path:
    return _venv(outside / "venv-broker", f"{wheel}[broker]", outside)


@pytest.fixture
def running_gateway(
    broker_venv: Path, outside: Path, broker: Broker
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    if broker.management_url is None:
        pytest.skip("the gateway needs the management API")
    port = free_port()
    log_path = outside / "gateway.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                str(broker_venv / "rabbitflow-broker"),
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                broker.url,
                "--management-url",
                broker.management_url,
                "--state-file",
                str(outside / "state.json"),
                "--log-format",
                "json",
            ],
            cwd=outside,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not amqp_handshake_ok("127.0.0.1", port, timeout=2):
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "the gateway did not answer within 60 s"
                time.sleep(0.2)
            yield process, log_path
        finally:
            process.terminate()
            process.wait(30)
            sys.stderr.write(f"--- gateway log ---\n{log_path.read_text()}")


def test_the_installed_gateway_runs_the_compiled_engine(
    running_gateway: tuple[subprocess.Popen[str], Path], broker_venv: Path
) -> None:
    process, log_path = running_gateway
    site = broker_venv.parent / "lib"
    mapped = {
        line.split()[-1]
        for line in Path(f"/proc/{process.pid}/maps").read_text().splitlines()
        if line.endswith(".so")
    }
    engine = [path for path in mapped if "/rabbitflow_broker/" in path]
    # The group library and the engine's own module, from the new venv only.
    assert any(Path(p).name.startswith("_accel__mypyc.") for p in engine), sorted(mapped)
    assert any(
        p.endswith(f"/engine/connection{importlib.machinery.EXTENSION_SUFFIXES[0]}") for p in engine
    ), sorted(engine)
    assert all(Path(p).resolve().is_relative_to(site.resolve()) for p in engine), engine
    assert not any(str(ROOT) in p for p in mapped)
    # ... and the gateway says so in its start line.
    deadline = time.monotonic() + 30
    while '"engine": "compiled (mypyc)"' not in log_path.read_text():
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)


def test_version_names_the_engine(broker_venv: Path, outside: Path) -> None:
    out = _run(broker_venv / "rabbitflow-broker", "--version", cwd=outside).stdout
    assert out.strip() == f"rabbitflow-broker {VERSION} (engine: compiled (mypyc))"


def test_the_bare_wheel_imports_and_names_the_missing_extras(wheel: Path, outside: Path) -> None:
    bin_dir = _venv(outside / "venv-bare", str(wheel), outside)
    probe = "import rabbitflow, rabbitflow_broker; print(rabbitflow.__version__)"
    assert _run(bin_dir / "python", "-c", probe, cwd=outside).stdout.strip() == VERSION
    for command, extra in (
        ("rabbitflow-broker", "broker"),
        ("rabbitflow-demo", "broker"),
        ("rabbitflow-analyze", "pipeline"),
    ):
        for args in ((), ("--help",)):
            done = subprocess.run(
                [str(bin_dir / command), *args],
                cwd=outside,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (command, args, done.stderr)
            assert f"pip install 'rabbitflow[{extra}]'" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr + done.stdout
        version = _run(bin_dir / command, "--version", cwd=outside).stdout
        assert version.strip() == f"{command} {VERSION}"
    # The admin CLI needs no extra.
    assert "add-queue" in _run(bin_dir / "rabbitflow-config", "--help", cwd=outside).stdout
