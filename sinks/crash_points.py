"""Crash points: a test-only switch that kills the process at a named place, for real.

The crash tests of design.md §10 need a process that dies *exactly* between two
steps (files written, commit not yet made; commit made, checkpoint not yet
written). Setting the environment variable ``COMPACTED_SINK_CRASH_AT`` to a
point's name makes the process send itself ``SIGKILL`` when it reaches that
point: no ``finally`` block, no ``atexit`` hook and no Spark shutdown runs, as
when a machine loses power. ``name@n`` kills on the n-th time the point is
reached (1-based). Unset, a crash point costs one dictionary lookup.

In-process tests can also `arm` a point with a callback, to interleave another
writer deterministically at that place (an append whose commit races a pass).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

CRASH_AT_ENV = "COMPACTED_SINK_CRASH_AT"

APPEND_BEFORE_COMMIT = "append.before_commit"
"""An append wrote its data files on the executors and has not committed them."""
APPEND_AFTER_STAGED_WRITE = "append.after_staged_write"
"""Spark's writer wrote an append's files into its staging directory; none is renamed yet."""
CLEAN_BEFORE_COMMIT = "clean.before_commit"
"""A pass wrote its cleaned files and has not committed the swap."""
CLEAN_BEFORE_CHECKPOINT = "clean.before_checkpoint"
"""A pass committed its swap and has not written the checkpoint table."""
RETENTION_BEFORE_COMMIT = "retention.before_commit"
"""Retention planned which files go and has not committed their removal."""
SCHEMA_BEFORE_APPEND = "schema.before_append"
"""A batch's evolved schema is committed; its files are written and not yet committed."""
DEAD_LETTER_BEFORE_APPEND = "dead_letter.before_append"
"""Bad rows are committed to the dead-letter table; the good rows are not yet appended."""
RECOVERY_AFTER_ORPHAN_DELETED = "recovery.after_orphan_deleted"
"""Recovery deleted one orphan file (reached once per file; ``@n`` stops after the n-th)."""
RECOVERY_BEFORE_MARKER = "recovery.before_marker"
"""Recovery finished its checks and has not written its recovery point."""
SEGMENT_DELETER_AFTER_FILE_DELETED = "segment_deleter.after_file_deleted"
"""The segment deleter deleted one expired file (reached once per file; ``@n`` after the n-th)."""

POINTS = (
    APPEND_AFTER_STAGED_WRITE,
    APPEND_BEFORE_COMMIT,
    SCHEMA_BEFORE_APPEND,
    CLEAN_BEFORE_COMMIT,
    CLEAN_BEFORE_CHECKPOINT,
    RETENTION_BEFORE_COMMIT,
    DEAD_LETTER_BEFORE_APPEND,
    RECOVERY_AFTER_ORPHAN_DELETED,
    RECOVERY_BEFORE_MARKER,
    SEGMENT_DELETER_AFTER_FILE_DELETED,
)

_hits: dict[str, int] = {}
_armed: dict[str, Callable[[], None]] = {}


def crash_point(name: str) -> None:
    """Die here with SIGKILL when ``COMPACTED_SINK_CRASH_AT`` names this point; else run its hook.

    Never raises in production: with the variable unset and nothing armed, it returns.
    """
    hook = _armed.get(name)
    if hook is not None:
        hook()
    target = os.environ.get(CRASH_AT_ENV)
    if not target:
        return
    point, _, nth = target.partition("@")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def armed(name: str, hook: Callable[[], None], *, once: bool = True) -> Iterator[None]:
    """Run ``hook`` when the process reaches ``name`` (only the first time when ``once``).

    For in-process tests that need another writer to act at an exact place.
    """
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")

    def run() -> None:
        if once:
            _armed.pop(name, None)
        hook()

    _armed[name] = run
    try:
        yield
    finally:
        _armed.pop(name, None)
