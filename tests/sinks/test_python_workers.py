"""Spark's Python workers must import the package: a one-line error, or a local fix.

The local fix runs end to end in a subprocess whose ``PYSPARK_PYTHON`` is the
system Python (which has no pyarrow, so it cannot import ``sinks``), as a Jupyter
kernel or an unactivated venv leaves it: the first batch succeeds and says what
it did. The error path runs on the test session with its workers pointed at that
Python and the master taken as remote (the fix is for local masters only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinks import ConfigError, python_workers
from sinks.python_workers import check_python_workers, worker_failure, workers_message

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
needs_system_python = pytest.mark.skipif(
    not os.path.exists(SYSTEM_PYTHON)
    or subprocess.run([SYSTEM_PYTHON, "-c", "import pyarrow"], capture_output=True).returncode == 0,
    reason="needs a system Python without pyarrow",
)

SCRIPT = """
import sys
from pyspark.sql import SparkSession
from sinks import CompactedStateSink
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
sink = CompactedStateSink(sys.argv[1])
sink(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
print("state", sink.state().count())
"""


def test_the_failure_line_is_found_among_sparks_trace():
    trace = "calling o1.collect.\n  File x\nModuleNotFoundError: No module named 'sinks'\n"
    assert worker_failure(trace) == "ModuleNotFoundError: No module named 'sinks'"
    message = workers_message("/usr/bin/python3", "ModuleNotFoundError: No module named 'sinks'")
    assert "set PYSPARK_PYTHON" in message and sys.executable in message and "\n" not in message


@needs_system_python
def test_a_remote_master_fails_the_batch_with_one_line(spark, monkeypatch):
    context = spark.sparkContext
    monkeypatch.setattr(python_workers, "_is_local", lambda master: False)
    monkeypatch.setattr(context, "pythonExec", SYSTEM_PYTHON)
    monkeypatch.setattr(python_workers, "_checked", set())
    with pytest.raises(ConfigError, match=r"cannot import 'sinks' \(ModuleNotFoundError") as e:
        check_python_workers(spark)
    assert "set PYSPARK_PYTHON" in str(e.value) and "\n" not in str(e.value)


@needs_system_python
def test_a_local_master_runs_the_workers_on_this_python(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_DRIVER_PYTHON",)}
    env.update(PYSPARK_PYTHON=SYSTEM_PYTHON, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "users")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "state 1" in done.stdout
    assert f"now runs them with {sys.executable}" in done.stderr
    assert "Traceback" not in done.stderr
