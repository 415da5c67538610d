"""Spark's Python workers must import this package: checked once, before the first batch.

The append, the passes and the reads run Python code on executors (``mapInArrow``
tasks), in the interpreter Spark starts for its Python workers: ``PYSPARK_PYTHON``
(or ``spark.pyspark.python``), else whatever ``python3`` is on the PATH. A notebook
kernel or a script run with a venv's Python without activating the venv leaves it
unset, and the workers then run the system Python, which has neither this package
nor pyarrow: the first batch failed with ``ModuleNotFoundError: No module named
'sinks'`` under a few hundred lines of traceback.

The consumers' source (``spark.readStream.format("compacted-state")``) runs in the
same workers: its ``register`` makes the same check, before the format is registered
with the context's interpreter.

`check_python_workers` runs one one-task probe job per SparkContext that imports
the package on a worker; the import is tried inside the task, so a failed probe is
an answer rather than a failed task and Spark logs nothing about it. The probe is a
SQL job (a Python UDF), as the sink's own tasks are: Spark keeps one Python worker
daemon per interpreter and environment, and an RDD job's environment differs from a
SQL task's, so an RDD probe left a second daemon on every executor. The session's
log level is never changed: a level set and put back loses a shell's or notebook's
console threshold (WARN), and Spark's INFO lines then flood it. When the probe fails
on a local master (the workers run on this machine), the context is pointed at this
process's interpreter (the driver's), and the probe runs again; elsewhere, or when
that fails too, it raises `ConfigError` with one line saying what to set. Under
Spark Connect the workers belong to the
server and nothing is checked here.
"""

from __future__ import annotations

import logging
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sinks.errors import ConfigError

logger = logging.getLogger("compacted_sink")

PACKAGE = "sinks"
_checked: set[tuple[int, tuple[str, ...]]] = set()  # (SparkContext id, packages) known good
_lock = threading.Lock()


def check_python_workers(spark: SparkSession, packages: tuple[str, ...] = (PACKAGE,)) -> None:
    """Make sure Spark's Python workers import ``packages``; once per SparkContext.

    The sink calls it before its first batch, and ``streaming.consumers.datasource.register``
    before it registers the ``compacted-state`` format (whose readers run in the
    workers too, with the interpreter the context names at registration).
    Idempotent. On a local master it may set the context's Python to this
    process's interpreter (logged once). Raises `ConfigError` naming
    ``PYSPARK_PYTHON`` when the workers cannot import the packages. Leaves the
    session's logging as it found it.
    """
    from sinks.spark_session import is_connect

    if is_connect(spark):
        return
    context = spark.sparkContext
    with _lock:
        if (id(context), packages) in _checked:
            return
        failure = _probe(spark, packages)
        if (
            failure is not None
            and _is_local(context.master)
            and context.pythonExec != sys.executable
        ):
            tried = context.pythonExec
            context.pythonExec = sys.executable
            failure = _probe(spark, packages)
            if failure is None:
                logger.warning(
                    "Spark's Python workers ran %s, which cannot import %r; this local "
                    "session now runs them with %s (set PYSPARK_PYTHON to it to silence this)",
                    tried,
                    packages[0],
                    sys.executable,
                )
            else:
                context.pythonExec = tried
        if failure is not None:
            raise ConfigError(workers_message(context.pythonExec, failure))
        _checked.add((id(context), packages))


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


def _probe(spark: SparkSession, packages: tuple[str, ...]) -> str | None:
    """Import ``packages`` in one Python worker task; None when it works, else why not.

    A plain (pickled, not Arrow) UDF: the worker needs no pyarrow to give its answer, and
    the UDF takes the context's Python as it is when the UDF is made.

    The import is tried inside the task, so a missing package is the task's answer,
    not a failed task: no executor error reaches the JVM's log, and the session's
    logging (levels, the shell's console threshold) is never touched.
    """

    def imports(_):
        # A nested function is pickled by value: the worker must import the packages itself.
        try:
            for package in packages:
                __import__(package)
        except Exception as e:  # ImportError and whatever a package raises
            return f"{type(e).__name__}: {e}"
        return None

    try:
        probe = F.udf(imports, "string", useArrow=False)
        return spark.range(0, 1, 1, 1).select(probe("id")).collect()[0][0]
    except Exception as e:  # the worker did not start: Py4JJavaError, ...
        return worker_failure(str(e))


def _is_local(master: str) -> bool:
    return master.startswith("local")
