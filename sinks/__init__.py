"""The compacted-state sink: Kafka's log compaction for Delta Lake tables on Spark."""

# First: without a supported pyspark module the import stops here, naming the range.
from sinks.spark_compat import SparkVersionError  # isort: skip
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.config import CleanerConfig
from sinks.errors import (
    BadInputError,
    ChangeDataExpiredError,
    CleanerError,
    CommitConflictError,
    CompactedSinkError,
    ConfigError,
    CorruptDataFileError,
    DataFileError,
    ForeignChangeError,
    HistoryExpiredError,
    KeyColumnsMismatchError,
    LogCorruptedError,
    MissingDataFileError,
    NotACompactedLogError,
    OffsetOutOfRangeError,
    QueryIdentityError,
    SchemaMismatchError,
    TableFeatureError,
    TimeTravelError,
)
from sinks.reading.arrow_state import read_state, read_state_batches
from sinks.reading.lookup import lookup
from sinks.sink import CHECKPOINT_TABLE_DIR, AppendReport, CompactedStateSink

__all__ = [
    "CHECKPOINT_TABLE_DIR",
    "AppendReport",
    "BadInputError",
    "CleanerConfig",
    "CleanerError",
    "CleanerStats",
    "CommitConflictError",
    "CompactedSinkError",
    "CompactedStateSink",
    "ConfigError",
    "CorruptDataFileError",
    "DataFileError",
    "ForeignChangeError",
    "ChangeDataExpiredError",
    "HistoryExpiredError",
    "KeyColumnsMismatchError",
    "LogCorruptedError",
    "MissingDataFileError",
    "NotACompactedLogError",
    "OffsetOutOfRangeError",
    "QueryIdentityError",
    "SchemaMismatchError",
    "SparkVersionError",
    "TableFeatureError",
    "TimeTravelError",
    "lookup",
    "read_state",
    "read_state_batches",
]
