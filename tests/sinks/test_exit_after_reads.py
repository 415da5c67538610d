"""A process that read a log and its tables exits with code 0 (issue 61, point 5).

delta-rs's ``to_pyarrow_table`` left Python-owned buffers on Arrow's I/O threads, whose
release during interpreter finalization aborted the process (SIGABRT, exit code 134,
"terminate called without an active exception") after its work was done: in 5 of 20
runs of a script that read the cleaner-offset checkpoint and exited (design.md §58). Each
case runs ``exit_script.py`` in fresh processes without Spark and asserts exit code 0
every time; ``make soak-exit`` runs the same loops longer, beside the
``to_pyarrow_table`` control that still aborts.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinks import CleanerConfig, CompactedStateSink

SCRIPT = Path(__file__).with_name("exit_script.py")
ROOT = SCRIPT.parents[2]

CHECKPOINT_RUNS = 12
"""The fastest exit after a checkpoint-table read: with ``to_pyarrow_table`` 5 of 20 runs
aborted on a quiet machine (fewer under load), so 12 clean runs by chance are unlikely."""
READER_RUNS = 3
SCANS_THROUGH_A_PYTHON_FILE_SYSTEM = {"to_pyarrow_table", "to_pyarrow_dataset", "to_pandas"}
"""delta-rs's reads that scan a pyarrow dataset over ``PyFileSystem(DeltaStorageHandler)``."""


def run_script(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture
def log(spark, tmp_path):
    """A cleaned log with a dirty batch above the pass, its checkpoint table beside it."""
    path = str(tmp_path / "log")
    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    for batch_id in range(2):
        rows = [(f"k{i}", f"v{batch_id}-{i}") for i in range(30)]
        sink(spark.createDataFrame(rows, "key string, value string"), batch_id)
    sink.clean(force=True)
    sink(spark.createDataFrame([("k1", "late")], "key string, value string"), 2)
    sink.close()
    return path


def test_a_service_that_read_the_state_a_key_and_the_tables_exits_cleanly(log):
    codes = []
    for _ in range(READER_RUNS):
        done = run_script("reader", log, timeout_s=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.rstrip().endswith("read")
        codes.append(done.returncode)
    for _ in range(CHECKPOINT_RUNS):
        done = run_script("checkpoints", log, timeout_s=60)
        assert done.returncode == 0, done.stderr[-2000:]
        codes.append(done.returncode)
    assert codes == [0] * (READER_RUNS + CHECKPOINT_RUNS)


def test_the_library_scans_no_delta_table_through_a_python_file_system():
    """The rule behind the exits above, as code (design.md §58): only `read_whole_table`
    asks delta-rs for its dataset (to list the files, not to scan them); no library module
    calls ``to_pyarrow_table``, ``to_pandas`` or a dataset scan of delta-rs's."""
    calls = []
    for package in ("checkpoints", "sinks", "streaming"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in SCANS_THROUGH_A_PYTHON_FILE_SYSTEM
                ):
                    calls.append(f"{path.relative_to(ROOT)} {node.attr}")
    assert calls == ["checkpoints/table_read.py to_pyarrow_dataset"]
