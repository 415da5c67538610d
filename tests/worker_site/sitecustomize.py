"""What every Python process the tests' Spark starts does first: load pyspark from its
installed package, and, in pyspark's worker daemon, import the sink before it forks.

Spark puts ``pyspark/python/lib/pyspark.zip`` and py4j's source zip first on its Python
processes' path (the worker daemon and its forks, a Connect server's ``foreachBatch`` workers,
a streaming data source's runner). Python cannot cache bytecode for a zip, so each of those
processes compiled pyspark's modules from source: importing ``pyspark.daemon`` cost 1.2-1.5
CPU-seconds from the zip against 0.3 from the installed package beside it. These zips hold the
same files as that package (they ship inside it), so they go last on the path: the same code
runs, and a Python without pyspark installed (the ``python3`` on the PATH that a test starts
the workers with) still finds it there.

pyspark's daemon forks one worker per task slot, and forks again for a worker that was idle
for a minute. Each fork imported the sink's task modules (pyarrow, pandas, the sink's packages)
when it unpickled its first task, 0.6 CPU-seconds, which that task then froze (design.md §45).
The daemon imports them once, before it forks, and freezes them: a fork starts with them.
The tasks run the same code.
`tests/conftest.py` puts this directory on ``PYTHONPATH``, which Spark appends to its own.
"""

import gc
import importlib
import os
import sys

_LIB = os.path.join("pyspark", "python", "lib")
for _zip in [p for p in sys.path if p.endswith(".zip") and os.path.dirname(p).endswith(_LIB)]:
    sys.path.remove(_zip)
    sys.path.append(_zip)

# What a worker's tasks import: pyspark's worker (it imports pandas for Arrow tasks), the
# sink (its package imports every task: an append's, a pass's recopy, a read's, with pyarrow
# and delta-rs) and the data source's reader.
_TASK_MODULES = ("pyspark.worker", "pandas", "sinks", "streaming")

if getattr(sys, "orig_argv", [])[1:3] == ["-m", "pyspark.daemon"]:
    for _module in _TASK_MODULES:
        try:
            importlib.import_module(_module)
        except Exception:  # a Python without it: a task that needs it fails there
            pass
    gc.freeze()
