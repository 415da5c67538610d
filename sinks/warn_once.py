"""Warnings said once per process: the one place the library remembers what it has said.

A warning about a condition that stays (a Kafka config key that does not apply here, a
log store that can race the sink's commits, another engine's change to a log) would
otherwise be logged on every call that meets it, and a streaming query meets it every
micro-batch. Such a warning is said the first time a process meets its *subject* (a
hashable value the caller names: a tuple of what the warning is about and the log, key
or version it concerns) and never again for that subject, from any thread
(design.md §67).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

logger = logging.getLogger("compacted_sink")

_SAID: set[Hashable] = set()  # every subject met in this process
_LOCK = threading.Lock()


def first_time(subject: Hashable) -> bool:
    """True the first time this process asks about ``subject``, False ever after."""
    with _LOCK:
        if subject in _SAID:
            return False
        _SAID.add(subject)
        return True


def warn_once(subject: Hashable, message: str, *args: object) -> bool:
    """Log ``message % args`` as a warning the first time this process meets ``subject``;
    True when it was said now."""
    if not first_time(subject):
        return False
    logger.warning(message, *args)
    return True
