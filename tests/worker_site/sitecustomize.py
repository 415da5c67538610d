"""What every Python process the tests' Spark starts does first: load pyspark from its
installed package, and, in pyspark's worker daemon, import the sink before it forks.

Spark puts ``pyspark/python/lib/pyspark.zip`` and py4j's source zip first on its Python
processes' path (the worker daemon and its forks, a Connect server's ``foreachBatch`` workers,
a streaming data source's runner). Python cannot cache bytecode for a zip, so each of those
processes compiled pyspark's modules from source: importing ``pyspark.daemon`` cost 1.2-1.5
CPU-seconds from the zip against 0.3 from the installed package beside it. These zips hold the
same files as that package (they ship inside it), so they are taken off the path: the same
code runs. (On the path, even last, each fork of the daemon read their directories again,
when pyspark's worker adds the task's files to the path and invalidates the import caches.)

pyspark's daemon forks one worker per task slot, and forks again when a worker was idle for a
minute. Each fork imported the sink's modules (pyarrow, pandas, the sink's packages) when it
unpickled its first task, 0.6 CPU-seconds, and a reused worker runs a full garbage
collection after every task, which walked all of them again. The daemon imports them once
before it forks, and freezes them (`gc.freeze`): a fork starts with them, and its
collections walk only what it made. The tasks run the same code.
`tests/conftest.py` puts this directory on ``PYTHONPATH``, which Spark appends to its own.
"""

import gc
import importlib
import os
import sys

_LIB = os.path.join("pyspark", "python", "lib")
for _zip in [p for p in sys.path if p.endswith(".zip") and os.path.dirname(p).endswith(_LIB)]:
    sys.path.remove(_zip)

# What a worker's tasks import: pyspark's worker and its Arrow serializers, the sink's tasks
# (an append, a pass's recopy, a state read) and the data source's reader.
_TASK_MODULES = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pandas",
    "pyarrow.compute",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "deltalake",
    "sinks",
    "sinks.cleaner.recopy_task",
    "sinks.produce.append_task",
    "streaming",
)

if sys.orig_argv[1:3] == ["-m", "pyspark.daemon"]:
    for _module in _TASK_MODULES:
        try:
            importlib.import_module(_module)
        except Exception:  # noqa: BLE001 - a Python without it: a task that needs it fails there
            pass
    gc.freeze()
