"""The compacted-state sink: Kafka's log compaction for Delta Lake tables on Spark."""

from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.config import CleanerConfig
from sinks.errors import (
    BadInputError,
    CleanerError,
    CommitConflictError,
    CompactedSinkError,
    ConfigError,
    ForeignChangeError,
    LogCorruptedError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
)
from sinks.log.history_window import HistoryExpiredError
from sinks.sink import AppendReport, CompactedStateSink
from sinks.spark_session import QueryIdentityError

__all__ = [
    "AppendReport",
    "BadInputError",
    "CleanerConfig",
    "CleanerError",
    "CleanerStats",
    "CommitConflictError",
    "CompactedSinkError",
    "CompactedStateSink",
    "ConfigError",
    "ForeignChangeError",
    "HistoryExpiredError",
    "LogCorruptedError",
    "OffsetOutOfRangeError",
    "QueryIdentityError",
    "SchemaMismatchError",
]
