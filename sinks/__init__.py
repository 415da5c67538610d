"""The compacted-state sink: Kafka's log compaction for Delta Lake tables on Spark.

The Arrow readers (`read_state`, `read_state_batches`, `lookup`), the config and the
errors import no pyspark: a service without Spark reads a log with ``deltalake`` and
``pyarrow`` alone (design.md §59). The Spark names (`CompactedStateSink`, `AppendReport`,
`CleanerStats`, `CHECKPOINT_TABLE_DIR`) are imported when first used; without a pyspark
module that use raises `SparkVersionError` naming the supported range.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# First: a pyspark older than 3.5 stops the import here, naming the range (no pyspark is
# fine until a Spark name is used).
from sinks.spark_version import refuse_an_old_pyspark  # isort: skip

refuse_an_old_pyspark()

from sinks.config import CleanerConfig  # noqa: E402
from sinks.errors import (  # noqa: E402
    BadInputError,
    ChangeDataExpiredError,
    CleanerError,
    CommitConflictError,
    CompactedSinkError,
    ConfigError,
    CorruptDataFileError,
    DataFileError,
    ErasureRestoreError,
    ForeignChangeError,
    HistoryExpiredError,
    KeyColumnsMismatchError,
    LogCorruptedError,
    MissingDataFileError,
    NotACompactedLogError,
    OffsetOutOfRangeError,
    QueryIdentityError,
    SchemaMismatchError,
    SparkVersionError,
    TableFeatureError,
    TimeTravelError,
)
from sinks.lazy_names import lazy_names  # noqa: E402
from sinks.reading.arrow_state import read_state, read_state_batches  # noqa: E402
from sinks.reading.lookup import lookup  # noqa: E402

if TYPE_CHECKING:
    from sinks.cleaner.cleaner_stats import CleanerStats
    from sinks.sink import CHECKPOINT_TABLE_DIR, AppendReport, CompactedStateSink

_SPARK_NAMES = {
    "CHECKPOINT_TABLE_DIR": "sinks.sink",
    "AppendReport": "sinks.sink",
    "CleanerStats": "sinks.cleaner.cleaner_stats",
    "CompactedStateSink": "sinks.sink",
}
"""The names whose modules import pyspark, and those modules: imported on first use."""


__getattr__ = lazy_names(
    "sinks",
    globals(),
    _SPARK_NAMES,
    # no pyspark: SparkVersionError, by name
    before=lambda: importlib.import_module("sinks.spark_compat"),
)


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
    "ErasureRestoreError",
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
