"""Spark's Python workers must import this package: checked once, before the first batch.

The append, the passes and the reads run Python code on executors (``mapInArrow``
tasks), in the interpreter Spark starts for its Python workers: ``PYSPARK_PYTHON``
(or ``spark.pyspark.python``), else whatever ``python3`` is on the PATH. A notebook
kernel or a script run with a venv's Python without activating the venv leaves it
unset, and the workers then run the system Python, which has neither this package
nor pyarrow: the first batch failed with ``ModuleNotFoundError: No module named
'sinks'`` under a few hundred lines of traceback.

`check_python_workers` runs one one-task probe job per SparkContext that imports
the package on a worker. When it fails on a local master (the workers run on this
machine), the context is pointed at this process's interpreter (the driver's), and
the probe runs again; elsewhere, or when that fails too, it raises `ConfigError`
with one line saying what to set. Under Spark Connect the workers belong to the
server and nothing is checked here.
"""

from __future__ import annotations

import logging
import sys
import threading

from pyspark.sql import SparkSession

from sinks.errors import ConfigError

logger = logging.getLogger("compacted_sink")

PACKAGE = "sinks"
_checked: set[int] = set()  # ids of SparkContexts whose workers import the package
_lock = threading.Lock()


def check_python_workers(spark: SparkSession) -> None:
    """Make sure Spark's Python workers import this package; once per SparkContext.

    Idempotent. On a local master it may set the context's Python to this
    process's interpreter (logged once). Raises `ConfigError` naming
    ``PYSPARK_PYTHON`` when the workers cannot import the package.
    """
    from sinks.spark_session import is_connect

    if is_connect(spark):
        return
    context = spark.sparkContext
    with _lock:
        if id(context) in _checked:
            return
        failure = _probe(context)
        if (
            failure is not None
            and _is_local(context.master)
            and context.pythonExec != sys.executable
        ):
            tried = context.pythonExec
            context.pythonExec = sys.executable
            failure = _probe(context)
            if failure is None:
                logger.warning(
                    "Spark's Python workers ran %s, which cannot import %r; this local "
                    "session now runs them with %s (set PYSPARK_PYTHON to it to silence this)",
                    tried,
                    PACKAGE,
                    sys.executable,
                )
            else:
                context.pythonExec = tried
        if failure is not None:
            raise ConfigError(workers_message(context.pythonExec, failure))
        _checked.add(id(context))


def workers_message(python: str, failure: str) -> str:
    """The one line a batch fails with when the workers cannot import the package. Pure."""
    return (
        f"Spark's Python workers run {python!r}, which cannot import {PACKAGE!r} ({failure}); "
        f"set PYSPARK_PYTHON (or spark.pyspark.python) to a Python that has compacted-sink "
        f"installed on every executor, e.g. {sys.executable}, before the SparkSession starts"
    )


def worker_failure(text: str) -> str:
    """The line of a failed probe's error that says why, among Spark's trace lines. Pure."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("ModuleNotFoundError:", "ImportError:", "PYTHON_VERSION_MISMATCH"):
        for line in lines:
            if marker in line:
                return line[line.index(marker) :]
    return lines[0] if lines else "the probe job failed"


def _probe(context) -> str | None:
    """Import the package in one Python worker task; None when it works, else why not."""
    package = PACKAGE
    level = _log_level(context)
    if level is not None:
        context.setLogLevel("OFF")  # a failed probe is expected: no executor trace on stderr
    try:
        # A lambda is pickled by value: the worker must import the package itself.
        context.parallelize([0], 1).map(lambda _: __import__(package).__name__).collect()
    except Exception as e:  # noqa: BLE001 - Py4JJavaError, PythonException, ...
        return worker_failure(str(e))
    finally:
        if level is not None:
            context.setLogLevel(level)
    return None


def _log_level(context) -> str | None:
    """The JVM's root log level (log4j 2), or None when it cannot be read."""
    try:
        return str(context._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    except Exception:  # noqa: BLE001 - no gateway or another logging backend: leave it alone
        return None


def _is_local(master: str) -> bool:
    return master.startswith("local")
