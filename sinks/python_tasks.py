"""What each of the sink's tasks does first in a Spark Python worker.

A reused Python worker runs a full ``gc.collect()`` after every task (pyspark's
``daemon.py``, 3.5 to 4.3). The collector walks every container object the worker tracks,
and once a task has imported pyarrow, pandas, pyspark's SQL modules and delta-rs that is
about 85,000 objects: 20 to 60 ms of CPU a task, more than a small batch's own work
(docs/design.md §45). `freeze_imports` moves what the worker holds when the first
task starts (what the imports made) into the collector's permanent generation, which a
collection skips; a later collection walks only what later tasks made.
"""

from __future__ import annotations

import gc
import sys

_frozen = False


def freeze_imports() -> None:
    """Exempt what this Spark Python worker holds now from the cyclic collector; once a
    process, and only inside a Spark task.

    Called first by every task the sink runs in Spark's Python workers, after its module's
    imports. Outside a task (the same code run by a driver: a small batch's writer, a test)
    it does nothing: the driver's heap is its user's. Idempotent (a worker freezes once).
    Frozen objects are still freed by reference counting, as before; what is given up is
    collecting reference cycles among them (module-level objects that live as long as the
    process, and the first task's own few objects). Returns nothing, raises nothing.
    """
    global _frozen
    if _frozen or "pyspark" not in sys.modules:  # a Spark worker has imported pyspark
        return
    from pyspark import TaskContext  # here: importing this module imports no pyspark

    if TaskContext.get() is None:
        return
    _frozen = True
    gc.freeze()
