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
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("COMPACTED_SINK_INSTALL_TESTS") == "required"
PIP_TIMEOUT_S = 600
# What a platform's Spark looks like on PyPI: the runtime's pyspark (Databricks 15.4/16.4 LTS,
# EMR 7, Dataproc 2.2 run Spark 3.5), and databricks-connect, which ships a `pyspark` module
# and no `pyspark` distribution (16.1.7: the newest for Python 3.11; Spark 3.5).
RUNTIME_PYSPARK = "pyspark==3.5.9"
DATABRICKS_CONNECT = "databricks-connect==16.1.7"
SHOW_PYSPARK = "import json, pyspark; print(json.dumps([pyspark.__version__, pyspark.__file__]))"


class Venv:
    """A venv with pip; every command's output is kept for the failure message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return subprocess.run(
            [self.python, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.path,
            timeout=PIP_TIMEOUT_S,
        )

    def pip(self, *args: str) -> str:
        """pip's output; a failed install fails the test under make, else skips it."""
        done = self.run("-m", "pip", *args)
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


def _assert_untouched(venv: Venv, output: str, before: dict[str, str], spark: str) -> None:
    assert f"Uninstalling {spark}" not in output, output
    after = venv.distributions()
    assert after.get(spark) == before.get(spark)
    assert "pyspark" not in after or "pyspark" in before, "pip put a PyPI pyspark beside it"
    assert venv.pip("check").strip() == "No broken requirements found."


def test_beside_a_runtime_pyspark_3_5(tmp_path: Path, wheel: Path) -> None:
    venv = Venv(tmp_path / "venv")
    venv.pip("install", "--quiet", RUNTIME_PYSPARK)
    before = venv.distributions()
    module = venv.pyspark()

    output = venv.pip("install", str(wheel))
    _assert_untouched(venv, output, before, "pyspark")
    assert venv.pyspark() == module == ["3.5.9", module[1]]
    imported = venv.run("-c", "import sinks, pyspark; print(pyspark.__version__)")
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip() == "3.5.9"

    # the documented command for a bare machine keeps a pyspark already in the range
    output = venv.pip("install", f"{wheel}[spark]")
    _assert_untouched(venv, output, before, "pyspark")


def test_beside_databricks_connect(tmp_path: Path, wheel: Path) -> None:
    venv = Venv(tmp_path / "venv")
    venv.pip("install", "--quiet", DATABRICKS_CONNECT)
    before = venv.distributions()
    assert "pyspark" not in before  # its `pyspark` module comes without a distribution
    module = venv.pyspark()

    output = venv.pip("install", str(wheel))
    _assert_untouched(venv, output, before, "databricks-connect")
    assert venv.pyspark() == module, "the pyspark module is no longer databricks-connect's"
    imported = venv.run(
        "-c", "import sinks, pyspark; from sinks import CompactedStateSink; print('ok')"
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
