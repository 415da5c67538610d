"""A service rebuilds its state without Spark (issue 61, point 6; design.md §59): the
package installed with pip into a venv that has no pyspark (no ``spark`` extra) reads a
log's state and a key with ``read_state`` and ``lookup``, imports no pyspark doing so, and
refuses the sink by name.

The log is made beforehand by this process's Spark; the venv is a throwaway one under
``tmp_path`` built as in `test_install_beside` (pip's cache makes a rerun quick). Under
``make test-install`` (``COMPACTED_SINK_INSTALL_TESTS=required``) a pip that cannot fetch
fails the test; elsewhere it skips with pip's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinks import CleanerConfig, CompactedStateSink, lookup, read_state

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("COMPACTED_SINK_INSTALL_TESTS") == "required"
PIP_TIMEOUT_S = 600

READ = """
import json, sys
import sinks
log = sys.argv[1]
state = sinks.read_state(log).sort_by("key")
found = sinks.lookup(log, ["k1", "k2", "gone"])
try:
    sinks.CompactedStateSink
    refused = None
except sinks.SparkVersionError as e:
    refused = str(e)
print(json.dumps({
    "state": state.select(["key", "value"]).to_pylist(),
    "found": found.select(["key", "value"]).to_pylist(),
    "pyspark imported": sorted(m for m in sys.modules if m.split(".")[0] == "pyspark"),
    "refused": refused,
}))
"""


def _fail_or_skip(message: str) -> None:
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=PIP_TIMEOUT_S
    )


@pytest.fixture
def log(spark, tmp_path: Path) -> str:
    """A cleaned log, a tombstone and a late record above the pass (dirty section)."""
    path = str(tmp_path / "lake" / "users")
    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    for batch_id in range(2):
        rows = [(f"k{i}", f"v{batch_id}-{i}") for i in range(20)]
        sink(spark.createDataFrame(rows, "key string, value string"), batch_id)
    sink.clean(force=True)
    late = [("k1", "late"), ("k3", None)]
    sink(spark.createDataFrame(late, "key string, value string"), 2)
    sink.close()
    return path


def test_the_state_and_a_key_are_read_in_a_venv_without_pyspark(log: str, tmp_path: Path):
    wheels = tmp_path / "wheel"
    built = _run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT),
        cwd=tmp_path,
    )  # fmt: skip
    if built.returncode != 0:
        _fail_or_skip(f"building the wheel failed:\n{built.stderr[-2000:]}")
    (wheel,) = wheels.glob("compacted_sink-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    done = _run(*pip, "install", "--quiet", "--no-compile", str(wheel), cwd=tmp_path)
    if done.returncode != 0:
        _fail_or_skip(f"pip install failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    listed = _run(*pip, "list", "--format", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "pyspark" not in {d["name"].lower() for d in json.loads(listed.stdout)}

    read = _run(python, "-c", READ, log, cwd=tmp_path)
    assert read.returncode == 0, read.stderr[-2000:]
    got = json.loads(read.stdout)
    expected = read_state(log).sort_by("key").select(["key", "value"]).to_pylist()
    assert got["state"] == expected and len(expected) == 19  # k3 deleted
    assert {"key": "k1", "value": "late"} in got["state"]
    assert got["found"] == lookup(log, ["k1", "k2"]).select(["key", "value"]).to_pylist()
    assert got["found"] == [{"key": "k1", "value": "late"}, {"key": "k2", "value": "v1-2"}]
    assert got["pyspark imported"] == []
    assert got["refused"].startswith("compacted-sink needs pyspark 3.5 or newer; no pyspark")
