"""The exception tree of the library (``sinks``, ``checkpoints``, ``streaming``): one root.

Every error raised by the library is defined here and derives from `CompactedSinkError`,
so a job can catch the family in one clause; each class says when it is raised. Lower-level
failures (delta-rs, Spark) are wrapped with the log and partition they concern and chained
with ``from``.
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


# Another writer got there first, at three levels: one commit (`ConcurrentCommitError`, the
# committer's, caught by whoever plans again), one cleaning pass (`LogCleaningAbortedError`,
# what a pass's commit race becomes; its round plans again), and an append, retention or
# erasure (or a checkpoint row's update) that lost every retry (`CommitConflictError`, the
# one a caller of the sink sees).


class ConcurrentCommitError(CompactedSinkError):
    """Raised when a log's commit finds that another writer committed first and it cannot be
    rebased over that; nothing of it landed, and the caller refreshes and plans again."""


class LogCleaningAbortedError(CompactedSinkError):
    """Raised when another writer (another cleaner, an OPTIMIZE) swapped the files a cleaning
    pass planned over before the pass committed; nothing of the pass landed, and it is planned
    again from the newer version (Kafka's ``LogCleaningAbortedException``)."""


class CommitConflictError(CompactedSinkError):
    """Raised when an append, retention, an erasure or a cleaner state's update lost the race
    to concurrent writers on every retry; nothing of it landed."""


class KeyColumnsMismatchError(ConfigError):
    """Raised when a sink names other key (or sequence) columns than the log records."""


class UnsupportedStoreError(ConfigError):
    """Raised when a URI names a scheme that neither delta-rs nor pyarrow can open."""


class CredentialsRefusedError(ConfigError):
    """Raised when an S3 bucket refuses the credentials the sink was given or derived."""

    def __init__(self, message: str, *, bucket: str, code: str) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.code = code


class QueryIdentityError(ConfigError):
    """Raised when a batch's streaming query cannot be told from another under Spark Connect."""


class JobConfigError(ConfigError):
    """Raised when a job file is unreadable or has an unknown or invalid key; names file and key."""


class SparkVersionError(CompactedSinkError):
    """Raised when a feature needs a newer Spark than the session's; names both versions and
    what to use instead."""

    def __init__(
        self, feature: str, needed: tuple[int, int], instead: str, *, found: str | None = None
    ) -> None:
        if not found:
            import pyspark

            found = f"this is pyspark {pyspark.__version__}"
        super().__init__(
            f"{feature} needs pyspark {needed[0]}.{needed[1]} or newer; {found}. {instead}"
        )
        self.feature = feature
        self.needed = needed


class InterpreterExitingError(CompactedSinkError):
    """Raised when a sink call starts after the interpreter began to exit; nothing was written."""


class TimeTravelError(CompactedSinkError, ValueError):
    """Raised when time travel asks for a version or a time the log cannot be read at."""


class HistoryExpiredError(TimeTravelError):
    """Raised when time travel asks for a version older than the history window keeps."""


class ChangeDataExpiredError(HistoryExpiredError):
    """Raised when a change feed read needs a version past the feed's retention (the history
    window): the before-images of its changes can no longer be read. Kafka's OffsetOutOfRange."""


class ReplayError(CompactedSinkError):
    """Raised when an export cannot be written, read or verified, or a restore cannot start."""


class RestoreTargetError(ReplayError, ConfigError):
    """Raised when a restore's target already holds records, or another log than the source's."""


class DataLossError(CompactedSinkError):
    """Raised when a reader's position lies below a partition's log start offset."""


class SchemaNotFoundError(CompactedSinkError):
    """Raised when a reader schema or a schema registry cannot be read."""


class BatchRefusedError(CompactedSinkError):
    """Raised when a micro-batch reaches a job's hook after it was told to refuse new batches
    (the job is stopping); nothing of the batch was written."""


class QueryFailedError(CompactedSinkError):
    """Raised when a job's query failed outside the sink (its source, Spark); the message is the
    root cause."""


class BrokerStartError(CompactedSinkError, RuntimeError):
    """Raised when the local Kafka broker exited or did not answer in time; the message ends
    with the tail of its log."""


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
