"""The sink's exception tree: one root, a handful of leaves.

Every error raised by this package derives from `CompactedSinkError`, so a job
can catch the family in one clause. Lower-level failures (delta-rs, Spark) are
wrapped with the log and partition they concern and chained with ``from``.
"""

from __future__ import annotations


class CompactedSinkError(Exception):
    """Raised when anything in the compacted-state sink fails; the root of the tree."""


class ConfigError(CompactedSinkError, ValueError):
    """Raised when a configuration key is unknown or its value is invalid; names the key."""


class BadInputError(CompactedSinkError, ValueError):
    """Raised when a batch cannot be written as it is; says what, which column, how many rows."""


class SchemaMismatchError(BadInputError):
    """Raised when a batch's columns do not match the log's schema; names the column.

    ``field_path`` is the refused field (``value.c.x``) when one is to blame.
    """

    def __init__(self, message: str, *, field_path: str | None = None) -> None:
        super().__init__(message)
        self.field_path = field_path


class NotACompactedLogError(CompactedSinkError, ValueError):
    """Raised when a path holds something other than a compacted log: a non-empty directory
    that is not a Delta table, or a Delta table this package did not create as a log. Says
    what was found and what to do; nothing is written to the path."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class ConcurrentCommitError(CompactedSinkError):
    """Raised by a log's commit when another writer committed first and this commit cannot be
    rebased over it; nothing of it landed, and the caller refreshes and plans again."""


class LogCleaningAbortedError(CompactedSinkError):
    """Raised inside a cleaning pass when another writer swapped the files it planned over
    first (another cleaner, an OPTIMIZE); nothing of the pass landed, and it is planned
    again from the newer version (Kafka's ``LogCleaningAbortedException``)."""


class CommitConflictError(CompactedSinkError):
    """Raised when a Delta commit kept conflicting with concurrent writers after all retries."""


class LogCorruptedError(CompactedSinkError):
    """Raised when recovery finds a log's offsets not unique and increasing; says where."""


class OffsetOutOfRangeError(CompactedSinkError, ValueError):
    """Raised when ``delete_records`` would move the log start past the log end offset."""


class CleanerError(CompactedSinkError):
    """Raised when a cleaning pass over one partition of a log fails."""

    def __init__(self, message: str, *, log_path: str, partition: int) -> None:
        super().__init__(f"{message} (log {log_path}, partition {partition})")
        self.log_path = log_path
        self.partition = partition


class ForeignChangeError(CompactedSinkError):
    """Raised when another engine changed a log's records (DELETE, UPDATE, MERGE, an overwrite,
    RESTORE); names the Delta version, the operation and the engine, and how to go on."""

    def __init__(self, message: str, *, log_path: str, version: int) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.version = version


class TableFeatureError(ForeignChangeError):
    """Raised when another engine gave a log a Delta table feature the sink cannot commit to
    (row tracking, clustering) or read exactly (deletion vectors, column mapping); names the
    feature, the version, and the way on."""


class DataFileError(CompactedSinkError):
    """Raised when a live data file of a log cannot be read as its add action describes it;
    names the file, the version that added it and the current version."""

    def __init__(
        self,
        message: str,
        *,
        log_path: str,
        path: str,
        added_version: int | None,
        current_version: int,
    ) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.path = path
        self.added_version = added_version
        self.current_version = current_version


class MissingDataFileError(DataFileError, FileNotFoundError):
    """Raised when a live data file of a log is gone from storage."""


class CorruptDataFileError(DataFileError):
    """Raised when a live data file of a log is not the size its add action records
    (truncated)."""
