"""design.md §45: a task's first step in a Spark Python worker freezes what the worker holds.

Inside a task it is checked by tests/sinks/test_spark_logging.py's script (a worker the
sink's tasks ran in reports the objects it froze). Here: outside a task it leaves the
process's collector alone (a driver's heap is its user's).
"""

from __future__ import annotations

import gc

from sinks.python_tasks import freeze_imports


def test_outside_a_spark_task_nothing_is_frozen() -> None:
    before = gc.get_freeze_count()
    freeze_imports()
    assert gc.get_freeze_count() == before == 0
