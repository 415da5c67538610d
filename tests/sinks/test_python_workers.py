"""Spark's Python workers must import the package: a one-line error, or a local fix.

The local fix runs end to end in tests/sinks/test_spark_logging.py, on the script
whose process that file starts anyway (``PYSPARK_PYTHON`` unset, so the workers would
start a ``python3`` without pyarrow, as a Jupyter kernel or an unactivated venv leaves
it): the first batch succeeds and says what it did. The error path runs on the test
session with its workers pointed at the system Python and the master taken as remote
(the fix is for local masters only).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sinks import ConfigError, python_workers
from sinks.python_workers import check_python_workers, worker_failure, workers_message

SYSTEM_PYTHON = "/usr/bin/python3"
needs_system_python = pytest.mark.skipif(
    not os.path.exists(SYSTEM_PYTHON)
    or subprocess.run([SYSTEM_PYTHON, "-c", "import pyarrow"], capture_output=True).returncode == 0,
    reason="needs a system Python without pyarrow",
)


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
