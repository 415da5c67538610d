"""The package installed into an environment that already has a Spark leaves that Spark as it
was: pyspark is not a dependency (it is the ``spark`` extra), so pip neither replaces a runtime's
pyspark nor puts a PyPI pyspark over databricks-connect's ``pyspark`` module.

Each test builds a throwaway venv under ``tmp_path`` with pip (pip's cache makes a rerun
quick), installs the platform's Spark, then this package's wheel, and checks what pip did.
Under ``make test-install`` (``COMPACTED_SINK_INSTALL_TESTS=required``) a pip that cannot
fetch fails the tests; elsewhere they skip with pip's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("COMPACTED_SINK_INSTALL_TESTS") == "required"
PIP_TIMEOUT_S = 600
# What a platform's Spark looks like on PyPI: the runtime's pyspark (Databricks 15.4/16.4 LTS,
# EMR 7, Dataproc 2.2 run Spark 3.5), and databricks-connect, which ships a `pyspark` module
# and no `pyspark` distribution (16.1.7: the newest for Python 3.11; Spark 3.5). It holds
# numpy below 2, and pip then picks a pyarrow that needs numpy 2 and a pandas 3 that Spark 3.5
# does not support: a working environment pins the two, as a user of it must.
# pyspark comes as sources: pip builds its wheel, here stored rather than deflated (its jars
# are compressed already: 8.6 s less of the build; the same files installed).
RUNTIME_PYSPARK = ["--config-settings", "--build-option=--compression=stored", "pyspark==3.5.9"]
DATABRICKS_CONNECT = ["databricks-connect==16.1.7", "pyarrow==20.0.0", "pandas<3"]
SHOW_PYSPARK = "import json, pyspark; print(json.dumps([pyspark.__version__, pyspark.__file__]))"


class Venv:
    """A venv without its own pip: this interpreter's pip installs into it (``--python``),
    without byte-compiling; every command's output is kept for the failure message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)

    def run(self, *args: str, python: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return subprocess.run(
            [python or self.python, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.path,
            timeout=PIP_TIMEOUT_S,
        )

    def pip(self, *args: str) -> str:
        """pip's output; a failed install fails the test under make, else skips it."""
        extra = ["--no-compile"] if args[0] == "install" else []
        done = self.run("-m", "pip", "--python", self.python, *args, *extra, python=sys.executable)
        if done.returncode != 0:
            message = f"pip {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            if REQUIRED or args[0] != "install":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        return done.stdout + done.stderr

    def distributions(self) -> dict[str, str]:
        listed = json.loads(self.pip("list", "--format", "json"))
        return {d["name"].lower(): d["version"] for d in listed}

    def pyspark(self) -> list[str]:
        """``[version, file]`` of the ``pyspark`` module this venv imports."""
        done = self.run("-c", SHOW_PYSPARK)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This package's wheel, built once from the work tree (no dependencies fetched)."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    if build.returncode != 0:
        message = f"building the wheel failed:\n{build.stderr[-2000:]}"
        if REQUIRED:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    (found,) = out.glob("compacted_sink-*.whl")
    return found


@dataclass
class Installed:
    """A platform's venv before and after ``pip install <the wheel>``."""

    venv: Venv
    before: dict[str, str]  # distribution -> version
    module: list[str]  # [version, file] of the `pyspark` module
    output: str  # what pip printed installing the wheel
    after: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> dict[str, Installed]:
    """Each platform's Spark in its venv, then the wheel: the platforms side by side (pip
    mostly waits on disk and network)."""
    wanted = {"runtime": RUNTIME_PYSPARK, "databricks-connect": DATABRICKS_CONNECT}

    def install(name: str, requirements: list[str]) -> Installed:
        venv = Venv(tmp_path_factory.mktemp(name) / "venv")
        venv.pip("install", "--quiet", *requirements)
        done = Installed(venv, venv.distributions(), venv.pyspark(), "")
        done.output = venv.pip("install", str(wheel))
        done.after = venv.distributions()
        return done

    with ThreadPoolExecutor(len(wanted)) as pool:
        started = {name: pool.submit(install, name, reqs) for name, reqs in wanted.items()}
        return {name: future.result() for name, future in started.items()}


def _assert_untouched(done: Installed, spark: str) -> None:
    assert f"Uninstalling {spark}" not in done.output, done.output
    assert done.after.get(spark) == done.before.get(spark)
    changed = {n: (v, done.after.get(n)) for n, v in done.before.items() if done.after.get(n) != v}
    assert not changed, f"pip changed what the environment had: {changed}"
    assert "pyspark" not in done.after or "pyspark" in done.before, "pip added a PyPI pyspark"
    assert done.venv.pyspark() == done.module, "the pyspark module is not the platform's"
    assert done.venv.pip("check").strip() == "No broken requirements found."


def test_beside_a_runtime_pyspark_3_5(installed: dict[str, Installed], wheel: Path) -> None:
    done = installed["runtime"]
    assert done.module[0] == "3.5.9"
    _assert_untouched(done, "pyspark")
    imported = done.venv.run("-c", "import sinks, pyspark; print(pyspark.__version__)")
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip() == "3.5.9"

    # the documented command for a bare machine keeps a pyspark already in the range
    would = done.venv.pip("install", "--dry-run", f"{wheel}[spark]")
    to_install = [line for line in would.splitlines() if line.startswith("Would install")]
    assert not any("pyspark" in line for line in to_install), would


def test_beside_databricks_connect(installed: dict[str, Installed]) -> None:
    done = installed["databricks-connect"]
    assert "pyspark" not in done.before  # its `pyspark` module comes without a distribution
    _assert_untouched(done, "databricks-connect")
    imported = done.venv.run(
        "-c", "import sinks, pyspark; from sinks import CompactedStateSink; print('ok')"
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
