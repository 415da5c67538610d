"""A read of a Delta log that another process trims meanwhile (design.md §46).

A Delta table object reads some of its snapshot again from the commit and checkpoint
files it was opened from (delta-rs reads a snapshot's remove actions lazily, for a
vacuum's listing or a checkpoint). Another deleter of the same log may trim those files
after the open: `on_a_trimmed_log` repeats such a step on the table opened anew.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from deltalake.exceptions import DeltaError

from sinks.log.location import LogLocation
from sinks.log.log_format import DELTA_LOG_DIR

logger = logging.getLogger("compacted_sink")

_T = TypeVar("_T")

TRIM_RACE_ATTEMPTS = 3
"""Tries of one read of a Delta log that another deleter trims meanwhile (design.md §46)."""


def on_a_trimmed_log(location: LogLocation, table: Any, step: Callable[[Any], _T]) -> _T:
    """``step(table)``; when a commit file the table was opened from is gone (another
    deleter of the same log trimmed it after the open: delta-rs reads a snapshot's remove
    actions from the commit files lazily), ``step`` again on the table opened anew, up to
    `TRIM_RACE_ATTEMPTS` tries. ``step`` must be safe to repeat."""
    for _ in range(TRIM_RACE_ATTEMPTS - 1):
        try:
            return step(table)
        except (FileNotFoundError, DeltaError) as e:
            if not trimmed_under(e):
                raise
            logger.debug("%s: Delta log trimmed under a read, opened again: %s", location.uri, e)
            table = location.delta_table()
    return step(table)


def trimmed_under(e: Exception) -> bool:
    """Whether delta-rs's error says a file of the Delta log the table was opened from is
    gone: a commit or checkpoint "not found", or a log segment with no files left. What to
    do then (open the latest version, or the same version again) is the caller's."""
    text = str(e)
    gone = DELTA_LOG_DIR in text and "not found" in text.lower()
    return gone or "No files in log segment" in text
