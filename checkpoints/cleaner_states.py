"""The cleaner states a checkpoint row holds, and when a claim on a partition is live.

Kafka's ``LogCleanerManager`` keeps ``LogCleaningInProgress``, ``LogCleaningAborted``
and ``LogCleaningPaused`` in memory; here they are the checkpoint table's
``cleaner_state`` column (`sinks.cleaner.cleaner_manager` moves them). What a row
*says* is read here, below every writer, so that recovery (which must not delete a
live pass's files) and the manager read a claim the same way. Pure but for
`owner_is_dead`, which asks this host whether a process still exists.

States of one (log, partition):

- ``idle`` (or no row): anyone may start a pass.
- ``in_progress``: ``state_owner`` is cleaning; ``state_heartbeat_ms`` proves it
  lives. A heartbeat older than ``heartbeat_timeout_ms`` means the owner died
  (the process was killed mid-pass): another cleaner may take over.
- ``paused``: cleaning was paused (around ``delete_records`` and restores); nobody
  cleans until it is resumed.
- ``uncleanable``: the last pass failed with ``uncleanable_reason``; the partition
  is retried once ``uncleanable_since_ms`` plus an exponential backoff (doubling
  per failed attempt, capped) has passed, not abandoned until restart.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable

from checkpoints.checkpoint_table import CheckpointEntry

IDLE = "idle"
IN_PROGRESS = "in_progress"
PAUSED = "paused"
UNCLEANABLE = "uncleanable"

HEARTBEAT_TIMEOUT_MS = 120_000
BACKOFF_BASE_MS = 15_000  # Kafka's log.cleaner.backoff.ms (`CleanerConfig.backoff_ms`)
BACKOFF_MAX_MS = 3_600_000


def default_owner() -> str:
    """A cleaner's identity: host, process id and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def uncleanable_backoff_ms(
    failed_attempts: int, *, base_ms: int = BACKOFF_BASE_MS, max_ms: int = BACKOFF_MAX_MS
) -> int:
    """How long an uncleanable partition waits before its next try: ``base * 2^(n-1)``, capped."""
    if failed_attempts <= 0:
        return 0
    return min(max_ms, base_ms * 2 ** min(failed_attempts - 1, 40))


def may_start_cleaning(
    entry: CheckpointEntry | None,
    *,
    owner: str,
    now_ms: int,
    heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
    backoff_base_ms: int = BACKOFF_BASE_MS,
    backoff_max_ms: int = BACKOFF_MAX_MS,
) -> bool:
    """Whether ``owner`` may start a pass over the partition whose row is ``entry`` (pure)."""
    if entry is None or entry.cleaner_state in (None, IDLE):
        return True
    if entry.cleaner_state == IN_PROGRESS:
        return entry.state_owner == owner or heartbeat_expired(
            entry, now_ms=now_ms, heartbeat_timeout_ms=heartbeat_timeout_ms
        )
    if entry.cleaner_state == UNCLEANABLE:
        since = entry.uncleanable_since_ms or 0
        wait = uncleanable_backoff_ms(
            entry.failed_attempts or 0, base_ms=backoff_base_ms, max_ms=backoff_max_ms
        )
        return now_ms >= since + wait
    return False  # paused


def heartbeat_expired(entry: CheckpointEntry, *, now_ms: int, heartbeat_timeout_ms: int) -> bool:
    """True when an in-progress pass has not proved it lives for ``heartbeat_timeout_ms``,
    or when its owner is a process of this host that no longer exists (a killed cleaner)."""
    beat = entry.state_heartbeat_ms
    if beat is None or now_ms - beat > heartbeat_timeout_ms:
        return True
    return owner_is_dead(entry.state_owner)


def is_live_claim(
    entry: CheckpointEntry | None,
    *,
    now_ms: int,
    heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
    other_than: str | None = None,
) -> bool:
    """True when ``entry`` is a pass in progress, by an owner other than ``other_than``,
    whose heartbeat has not expired."""
    return (
        entry is not None
        and entry.cleaner_state == IN_PROGRESS
        and entry.state_owner != other_than
        and not heartbeat_expired(entry, now_ms=now_ms, heartbeat_timeout_ms=heartbeat_timeout_ms)
    )


def live_claims(
    entries: Iterable[CheckpointEntry],
    *,
    now_ms: int,
    heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
    other_than: str | None = None,
) -> set[int]:
    """The partitions of ``entries`` a live pass (of another owner than ``other_than``) holds."""
    return {
        e.partition
        for e in entries
        if is_live_claim(
            e, now_ms=now_ms, heartbeat_timeout_ms=heartbeat_timeout_ms, other_than=other_than
        )
    }


def owner_is_dead(owner: str | None) -> bool:
    """True when ``owner`` names a process of this host that has exited (pids are checked,
    owners on other hosts are presumed alive until their heartbeat expires)."""
    host, _, rest = (owner or "").partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    # A killed child not yet reaped by its parent still answers kill(pid, 0).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
