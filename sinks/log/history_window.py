"""The history window: how long removed files stay, so readers and time travel keep working.

Kafka deletes a segment the cleaner or retention removed ``file.delete.delay.ms``
after removing it; Delta keeps a removed file ``delta.deletedFileRetentionDuration``
(7 days) so that time travel and readers holding an older snapshot still find it.
Here both names are one setting (`CleanerConfig.file_delete_delay_ms`, the
*window*), written on the log as Delta table properties so that another engine's
VACUUM keeps exactly what this sink keeps:

- ``delta.deletedFileRetentionDuration``: the window;
- ``delta.logRetentionDuration``: the window too, so every version inside it can
  still be loaded (a version's files and its commit go together);
- ``delta.checkpointInterval``: a Delta checkpoint every 10 commits (delta-spark's
  default), so opening the log, and each ``txn`` lookup on it, reads one checkpoint
  and at most 10 commits (design.md §24);
- ``delta.enableExpiredLogCleanup``: false, because the sink trims the Delta log
  itself in one place (the segment deleter, on the cleaner's schedule) instead
  of in every writer's post-commit hook, where a cleanup racing a checkpoint can
  leave a table unloadable (delta-rs#3692).

Invariant: every version committed at or after ``now - window`` can be read
(`oldest_reachable_version`); reading an older one raises `HistoryExpiredError`,
which names the window. Commit times are the commit files' modification times,
as Delta's timestamp time travel uses them; edges within a second or two of the
window's start are not promised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs
from deltalake import DeltaTable

from checkpoints.checkpoint_table import DELTA_CHECKPOINT_INTERVAL, HANDS_OFF_PROPERTIES
from sinks.config import DELETED_FILE_RETENTION_DURATION, format_interval, parse_interval_ms
from sinks.errors import ConcurrentCommitError, HistoryExpiredError, TimeTravelError
from sinks.log.committer import DELTA_RS, LogCommitter
from sinks.log.location import LogLocation
from sinks.log.log_format import DELTA_LOG_DIR

LOG_RETENTION_DURATION = "delta.logRetentionDuration"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
ENABLE_EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"

DEFAULT_WINDOW_MS = 7 * 24 * 3_600_000  # Delta's default deletedFileRetentionDuration


# delta-rs resolves a timestamp before the first commit to version 0 without a word; a
# request this much before the version it loaded is refused (commit times are file
# times, and a commit's own timestamp may precede its file's by a little).
_BEFORE_FIRST_COMMIT_SLACK_MS = 1_000


# -- the window as Delta table properties -----------------------------------------------------


def table_properties(window_ms: int) -> dict[str, str]:
    """The Delta table properties that make a log keep ``window_ms`` of history, no more,
    and ask other engines not to rearrange its files (`HANDS_OFF_PROPERTIES`)."""
    interval = format_interval(window_ms)
    return {
        **HANDS_OFF_PROPERTIES,
        DELETED_FILE_RETENTION_DURATION: interval,
        LOG_RETENTION_DURATION: interval,
        CHECKPOINT_INTERVAL: str(DELTA_CHECKPOINT_INTERVAL),
        ENABLE_EXPIRED_LOG_CLEANUP: "false",
    }


def window_of(table: DeltaTable) -> int:
    """The window a table keeps: its ``delta.deletedFileRetentionDuration`` (default 7 days)."""
    text = table.metadata().configuration.get(DELETED_FILE_RETENTION_DURATION)
    return DEFAULT_WINDOW_MS if text is None else parse_interval_ms(text)


ALIGN_ATTEMPTS = 3


def align_table_properties(
    table: DeltaTable, window_ms: int, committer: LogCommitter = DELTA_RS
) -> bool:
    """Set the window's properties on ``table`` when they differ; True when this call committed.

    Idempotent: a table that already has them is not touched (a metadata commit
    would make concurrent appends retry and a concurrent pass start over). A commit
    that lost a race (another sink's deleter setting the same properties, a commit
    that removed files) is made again on the table as it now is, unless the winner
    set them: `ALIGN_ATTEMPTS` commits at most, ``table`` then at a newer version.
    Raises `ConcurrentCommitError` when the last one loses too.
    """
    wanted = table_properties(window_ms)
    attempt = 1
    while any(table.metadata().configuration.get(k) != v for k, v in wanted.items()):
        try:
            committer.set_properties(table, wanted, metadata={})
            return True
        except ConcurrentCommitError:
            if attempt == ALIGN_ATTEMPTS:
                raise
            attempt += 1
            table.update_incremental()
    return False


# -- what the Delta log holds -----------------------------------------------------------------


@dataclass(frozen=True)
class DeltaLogListing:
    """The commit and checkpoint files in ``_delta_log``: versions, times, sizes (one listing)."""

    commit_ms: Mapping[int, int]
    checkpoints: frozenset[int]
    files: int
    size_bytes: int

    @property
    def oldest_loadable_version(self) -> int | None:
        """The first version a reader can load: 0 with every commit kept, else the oldest
        checkpoint (commits before it were cleaned up)."""
        if not self.commit_ms:
            return None
        first_commit = min(self.commit_ms)
        if first_commit == 0:
            return 0
        starts = [c for c in self.checkpoints if c >= first_commit - 1]
        return min(starts) if starts else first_commit


def list_delta_log(location: LogLocation) -> DeltaLogListing:
    """List the ``_delta_log`` of the table at ``location`` once: a LIST, no file is read."""
    fs, root = location.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{DELTA_LOG_DIR}", allow_not_found=True))
    commits: dict[int, int] = {}
    checkpoints: set[int] = set()
    files = size = 0
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        files += 1
        size += info.size or 0
        name = info.base_name
        if not name[:20].isdigit():
            continue
        version = int(name[:20])
        if name.endswith(".json") and len(name) == 25:
            commits[version] = int(info.mtime.timestamp() * 1000) if info.mtime else 0
        elif ".checkpoint" in name:
            checkpoints.add(version)
    return DeltaLogListing(commits, frozenset(checkpoints), files, size)


CommitStamp = tuple[int, int]
"""A commit file's size and modification time (nanoseconds): what tells one table's version
from another's at the same path (a table dropped and created again, a copy put back)."""


def commit_stamps(location: LogLocation, versions: list[int]) -> list[CommitStamp | None]:
    """The `CommitStamp` of each version's commit file in ``_delta_log``, None where there is
    none: one metadata read a file (on an object store a HEAD, and a listing where the file
    is not there), no file read. Raises the store's `OSError`."""
    fs, root = location.filesystem()
    paths = [f"{root}/{DELTA_LOG_DIR}/{v:020d}.json" for v in versions]
    return [
        None if info.type == pafs.FileType.NotFound else (info.size or 0, info.mtime_ns or 0)
        for info in fs.get_file_info(paths)
    ]


def oldest_reachable_version(
    listing: DeltaLogListing, *, current_version: int, now_ms: int, window_ms: int
) -> int:
    """The oldest version time travel still reaches: the first committed inside the window
    (the current version when none was), never one whose commits were cleaned up. Pure."""
    horizon = now_ms - window_ms
    inside = [v for v, at in listing.commit_ms.items() if at >= horizon and v <= current_version]
    oldest = min(inside) if inside else current_version
    loadable = listing.oldest_loadable_version
    return max(oldest, loadable) if loadable is not None else oldest


def reachable_commits(location: LogLocation, *, now_ms: int) -> dict[int, dict[str, Any]]:
    """The commits of the table at ``location`` that time travel still reaches
    (`oldest_reachable_version` up to the latest), by version: delta-rs's history rows, with
    ``timestamp``, ``operation`` and the commit's custom metadata. Read-only."""
    table = location.delta_table()
    oldest = oldest_reachable_version(
        list_delta_log(location),
        current_version=table.version(),
        now_ms=now_ms,
        window_ms=window_of(table),
    )
    return {c["version"]: c for c in table.history() if "version" in c and c["version"] >= oldest}


# -- time travel inside the window ------------------------------------------------------------


def check_reachable(
    location: LogLocation,
    requested: int | str | datetime,
    *,
    version: int | None,
    current: DeltaTable,
    now_ms: int,
    cause: BaseException | None = None,
) -> None:
    """Raise `TimeTravelError` when ``requested`` (resolved to ``version``, or None when it
    could not be loaded) cannot be read: `HistoryExpiredError` before the window of the
    log at ``location``; `TimeTravelError` past the newest version or before the first commit.
    Each names the versions (and times) that can be read.

    Returns quietly for a version inside the window; re-raises ``cause`` when the
    request failed for another reason.
    """
    window, uri = window_of(current), location.uri
    listing = list_delta_log(location)
    newest = current.version()
    oldest = oldest_reachable_version(
        listing, current_version=newest, now_ms=now_ms, window_ms=window
    )
    reachable = _reachable_range(listing, oldest, newest)
    requested_ms = _epoch_ms(requested)
    created_ms = _first_commit_ms(listing, current)
    if (
        requested_ms is not None
        and created_ms is not None
        and requested_ms < created_ms - _BEFORE_FIRST_COMMIT_SLACK_MS
    ):
        raise TimeTravelError(
            f"{uri}: as_of={requested!r} is before the log's first version: the log did not "
            f"exist yet (its first commit was at {_utc(created_ms)}); {reachable}"
        ) from cause
    if version is not None and version >= oldest:
        loaded_at = listing.commit_ms.get(version)
        if (
            requested_ms is not None
            and loaded_at
            and requested_ms < loaded_at - _BEFORE_FIRST_COMMIT_SLACK_MS
        ):
            raise TimeTravelError(
                f"{uri}: as_of={requested!r} is before the log's first version; {reachable}"
            ) from cause
        return
    if version is None and isinstance(requested, int) and requested > newest:
        raise TimeTravelError(
            f"{uri}: as_of={requested!r} is past the log's newest version; {reachable}"
        ) from cause
    if version is None and cause is not None and not isinstance(requested, int):
        if requested_ms is None:
            raise TimeTravelError(
                f"{uri}: as_of={requested!r} is neither a Delta version nor a timestamp "
                f"(ISO 8601, e.g. 2026-11-23T10:00:00Z); {reachable}"
            ) from cause
    raise HistoryExpiredError(
        f"{uri}: as_of={requested!r} is outside the history window "
        f"(file.delete.delay.ms / {DELETED_FILE_RETENTION_DURATION} = {format_interval(window)}); "
        f"{reachable}"
    ) from cause


def _first_commit_ms(listing: DeltaLogListing, current: DeltaTable) -> int | None:
    """When the log was created: its version 0's commit time, else (version 0 trimmed from
    the Delta log) the creation time its metadata records; None when neither is known."""
    if listing.commit_ms.get(0):
        return listing.commit_ms[0]
    try:
        created = current.metadata().created_time
    except Exception:  # metadata without a creation time: nothing to name
        return None
    return int(created) if created else None


def _reachable_range(listing: DeltaLogListing, oldest: int, newest: int) -> str:
    """What time travel reaches, in words: versions and the times they were committed."""
    return (
        f"time travel reaches versions {oldest} to {newest} "
        f"(committed {_utc(listing.commit_ms.get(oldest))} to "
        f"{_utc(listing.commit_ms.get(newest))})"
    )


def _utc(ms: int | None) -> str:
    if not ms:
        return "?"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _epoch_ms(requested: int | str | datetime) -> int | None:
    """Epoch milliseconds of a timestamp request (a naive one is UTC); None for a version."""
    if isinstance(requested, int):
        return None
    if isinstance(requested, str):
        try:
            requested = datetime.fromisoformat(requested.strip())
        except ValueError:
            return None
    if requested.tzinfo is None:
        requested = requested.replace(tzinfo=UTC)
    return int(requested.timestamp() * 1000)
