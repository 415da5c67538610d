"""Deleting files that left the log, after the history window (Kafka's asynchronous
segment deletion): design.md §23, §26.

`delete_expired_files` deletes, bounded per call, the files a table owns that left it
(or that no commit names) more than the window ago, and trims its Delta log;
`SegmentDeleter` runs it for a log and its checkpoint table at most once an interval.
Never deletes a file the table does not own, nor one any version inside the window uses.
Idempotent and crash-safe: a file already gone is skipped, and a deleter killed half-way
leaves files the next call deletes.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow.fs as pafs

from checkpoints import now_ms
from sinks.crash_points import SEGMENT_DELETER_AFTER_FILE_DELETED, crash_point
from sinks.log.committer import DELTA_RS, LogCommitter
from sinks.log.history_window import (
    DELETED_FILE_RETENTION_DURATION,
    align_table_properties,
    list_delta_log,
    parse_interval_ms,
    table_properties,
)
from sinks.log.location import LogLocation
from sinks.log.ownership import (
    CHECKPOINT_TABLE_NAME,
    DELTA_LOG_DIR,
    check_compacted_log,
    is_delta_rs_data_path,
    is_own_data_path,
)
from sinks.log.trimmed_log import on_a_trimmed_log

logger = logging.getLogger("compacted_sink")

TableKind = Literal["log", "checkpoint"]

_COMMIT_FILE = re.compile(r"\d{20}\.json")
_CHECKSUM_FILE = re.compile(r"(\d{20})\.crc")

DEFAULT_MAX_FILES = 1_000
"""Files one call deletes at most: a few seconds of DELETE calls on an object store."""

CHECKPOINT_TABLE_MIN_WINDOW_MS = 60_000  # Kafka's file.delete.delay.ms default
CHECKPOINT_TABLE_MAX_WINDOW_MS = 3_600_000
"""Bounds of the cleaner-offset checkpoint table's window (design.md §23)."""


@dataclass(frozen=True)
class DeletionReport:
    """What one call deleted from one Delta table, and what it left for the next call."""

    table: str
    deleted: tuple[str, ...] = ()
    deleted_bytes: int = 0
    left_for_next_call: int = 0
    skipped_busy: int = 0
    properties_set: bool = False
    log_files_before: int = 0
    log_files_after: int = 0
    duration_ms: int = 0

    def summary(self) -> str:
        """One line for the log saying what this call did; pure."""
        return (
            f"{self.table}: deleted {len(self.deleted)} file(s) ({self.deleted_bytes} B) "
            f"older than the window, {self.left_for_next_call} left for the next call, "
            f"{self.skipped_busy} skipped beside a live pass; Delta log "
            f"{self.log_files_before} -> {self.log_files_after} file(s) in {self.duration_ms} ms"
        )


def delete_expired_files(
    table_location: LogLocation,
    *,
    window_ms: int,
    max_files: int = DEFAULT_MAX_FILES,
    protected_partitions: Iterable[int] = (),
    trim_log: bool = True,
    kind: TableKind = "log",
    committer: LogCommitter = DELTA_RS,
) -> DeletionReport:
    """Delete up to ``max_files`` files of the table at ``table_location`` that left it more than
    ``window_ms`` ago (or that no commit names, are the table's own and are that old), then
    trim its Delta log.

    ``kind`` says whose naming makes an untracked file the table's own: a compacted log's
    (``"log"``) or the cleaner-offset checkpoint table's (``"checkpoint"``). Sets the
    window's table properties first when they differ (one metadata commit through
    ``committer``, design.md §36). Files of ``protected_partitions`` are kept for now.
    Returns a `DeletionReport`. Raises `NotACompactedLogError` (``kind="log"``) before
    anything is committed or deleted. Idempotent; safe to retry.
    """
    started = time.monotonic()
    table = table_location.delta_table()
    if kind == "log":
        check_compacted_log(table_location.uri, table)
    owned = is_own_data_path if kind == "log" else is_delta_rs_data_path
    changed = align_table_properties(table, window_ms, committer)
    if changed:
        table = table_location.delta_table()
    before = list_delta_log(table_location).files

    def expired(table: Any) -> list[str]:
        listed = table.vacuum(dry_run=True, full=True, enforce_retention_duration=False)
        named = set(table.vacuum(dry_run=True, full=False, enforce_retention_duration=False))
        # Sorted: delta-rs returns candidates unordered, and a fixed order makes a bounded
        # call's leftovers the next call's first files.
        return sorted(p for p in listed if p in named or owned(p))

    candidates = on_a_trimmed_log(table_location, table, expired)
    protected = tuple(f"partition-{p}/" for p in protected_partitions)
    allowed = [p for p in candidates if not p.startswith(protected)] if protected else candidates
    chosen = allowed[:max_files]
    fs, root = table_location.filesystem()
    sizes = fs.get_file_info([f"{root}/{p}" for p in chosen]) if chosen else []
    deleted, deleted_bytes = [], 0
    for path, info in zip(chosen, sizes, strict=True):
        try:
            fs.delete_file(f"{root}/{path}")
        except FileNotFoundError:
            continue  # another deleter got there first
        deleted.append(path)
        deleted_bytes += info.size or 0
        crash_point(SEGMENT_DELETER_AFTER_FILE_DELETED)
    if trim_log:
        own = table.version() if changed else None  # our properties' commit

        def trim(table: Any) -> None:
            if len(chosen) == len(candidates):  # else a checkpoint would forget removes due
                checkpoint_for_trim(table, table_location, window_ms=window_ms, own_version=own)
            table.cleanup_metadata()

        on_a_trimmed_log(table_location, table, trim)
        delete_trimmed_checksums(table_location)
    report = DeletionReport(
        table=table_location.uri,
        deleted=tuple(deleted),
        deleted_bytes=deleted_bytes,
        left_for_next_call=len(allowed) - len(chosen),
        skipped_busy=len(candidates) - len(allowed),
        properties_set=changed,
        log_files_before=before,
        log_files_after=list_delta_log(table_location).files if trim_log else before,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    if deleted or changed:
        logger.info("%s", report.summary())
    return report


def checkpoint_for_trim(
    table: Any, location: LogLocation, *, window_ms: int, own_version: int | None = None
) -> bool:
    """Write a Delta checkpoint of the latest version of an idle table (no commit inside
    the window) that has none: without one its commits cannot be trimmed, and it would keep
    them (and the statistics they carry, design.md §54) for ever. True if it wrote one.
    ``own_version`` is the deleter's own commit of the window's properties, which does not
    count as activity. Writes no commit; idempotent."""
    listing = list_delta_log(location)
    newest = max(listing.checkpoints, default=-1)
    if newest >= table.version():
        return False
    cutoff = now_ms() - window_ms  # against commit files' modification times: the wall clock
    # Only an idle table (its newest commit out of the window too): a busy one gets its
    # checkpoints from its commits, and a checkpoint of ours beside them would be trimmed
    # while a reader that opened from it still reads the log.
    stamps = [at for v, at in listing.commit_ms.items() if v != own_version]
    if not stamps or max(stamps) >= cutoff:
        return False
    table.create_checkpoint()
    return True


def delete_trimmed_checksums(location: LogLocation) -> int:
    """Delete the ``<version>.crc`` files (delta-spark's checksums, which may list files with
    their statistics, design.md §54) of versions whose commit was trimmed: delta-rs's
    trimming leaves them. Returns how many. Idempotent."""
    fs, root = location.filesystem()
    selector = pafs.FileSelector(f"{root}/{DELTA_LOG_DIR}", allow_not_found=True)
    infos = [i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]
    commits = [int(i.base_name[:20]) for i in infos if _COMMIT_FILE.fullmatch(i.base_name)]
    if not commits:
        return 0
    oldest = min(commits)
    deleted = 0
    for info in infos:
        m = _CHECKSUM_FILE.fullmatch(info.base_name)
        if m and int(m.group(1)) < oldest:
            try:
                fs.delete_file(info.path)
                deleted += 1
            except FileNotFoundError:
                continue
    return deleted


def checkpoint_table_window(log_window_ms: int) -> int:
    """The window of the cleaner-offset checkpoint table for a log keeping ``log_window_ms``,
    clamped to [1 min, 1 h]; pure."""
    return min(max(log_window_ms, CHECKPOINT_TABLE_MIN_WINDOW_MS), CHECKPOINT_TABLE_MAX_WINDOW_MS)


def delete_expired_checkpoint_files(
    table_location: LogLocation, *, log_window_ms: int, max_files: int = DEFAULT_MAX_FILES
) -> DeletionReport | None:
    """`delete_expired_files` for the cleaner-offset checkpoint table, whose window only
    ever shrinks (design.md §23).

    Returns None, deleting nothing, when the table does not exist yet or is not the one
    this package creates (then a warning). Idempotent; safe to retry.
    """
    uri = table_location.uri
    try:
        table = table_location.delta_table()
    except Exception:  # not created yet
        return None
    if table.metadata().name != CHECKPOINT_TABLE_NAME:
        logger.warning(
            "%s: not the cleaner-offset checkpoint table this package creates (its name is "
            "%r): nothing of it is deleted or changed",
            uri,
            table.metadata().name,
        )
        return None
    window = checkpoint_table_window(log_window_ms)
    current = table.metadata().configuration.get(DELETED_FILE_RETENTION_DURATION)
    keys_missing = any(k not in table.metadata().configuration for k in table_properties(window))
    if current is not None and not keys_missing:
        window = min(window, parse_interval_ms(current))
    return delete_expired_files(
        table_location, window_ms=window, max_files=max_files, kind="checkpoint"
    )


class SegmentDeleter:
    """Runs the deletion for one log (and its checkpoint table) at most every
    ``log.retention.check.interval.ms``: Kafka's scheduled ``kafka-delete-logs`` task.

    `maybe_run` is what the cleaner calls after each round; `run` deletes now.
    Thread-safe: two callers never delete at once (`maybe_run`'s second caller skips).
    """

    def __init__(
        self,
        log: LogLocation,
        checkpoint_table: LogLocation,
        *,
        window_ms: int,
        check_interval_ms: int,
        max_files: int = DEFAULT_MAX_FILES,
        committer: LogCommitter = DELTA_RS,
    ) -> None:
        self.log = log
        self.committer = committer  # the log's (design.md §36)
        self.checkpoint_table = checkpoint_table
        self.window_ms = window_ms
        self.check_interval_ms = check_interval_ms
        self.max_files = max_files
        self.last_report: DeletionReport | None = None
        self.last_checkpoint_report: DeletionReport | None = None
        self._next_run = 0.0
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True when the check interval has passed since the last run (no I/O)."""
        return time.monotonic() >= self._next_run

    def maybe_run(self, busy_partitions: Callable[[], Iterable[int]] = tuple) -> bool:
        """Delete now if the check interval has passed since the last run; True if it ran.

        Never raises: a failed run is logged and retried at the next interval.
        """
        if time.monotonic() < self._next_run or not self._lock.acquire(blocking=False):
            return False
        try:
            self._next_run = time.monotonic() + self.check_interval_ms / 1000
            self._run(busy_partitions)
        except Exception:  # deletion must never fail a batch or a pass
            logger.warning("deleting expired files of %s failed", self.log.uri, exc_info=True)
        finally:
            self._lock.release()
        return True

    def run(self, busy_partitions: Callable[[], Iterable[int]] = tuple) -> DeletionReport:
        """Delete expired files of the log and its checkpoint table now (bounded per table).

        Returns the log's `DeletionReport`; raises what `delete_expired_files` raises.
        Waits for a run in progress. Idempotent.
        """
        with self._lock:
            return self._run(busy_partitions)

    def _run(self, busy_partitions: Callable[[], Iterable[int]]) -> DeletionReport:
        self.last_report = delete_expired_files(
            self.log,
            window_ms=self.window_ms,
            max_files=self.max_files,
            protected_partitions=busy_partitions(),
            committer=self.committer,
        )
        self.last_checkpoint_report = delete_expired_checkpoint_files(
            self.checkpoint_table, log_window_ms=self.window_ms, max_files=self.max_files
        )
        return self.last_report
