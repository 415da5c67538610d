"""The clock: epoch milliseconds, where every timestamp the library writes comes from.

A sink, a cleaner or a checkpoint table is given a clock (a callable returning epoch
milliseconds; a test's simulated one, or `now_ms`), and stamps what it writes with it, so
that one process's rows, records and horizons agree with one another. `now_ms` is the wall
clock, the default everywhere; no other module reads the wall clock for a timestamp
(`tests/test_names.py` checks it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]
"""A source of epoch milliseconds."""


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return int(time.time() * 1000)
