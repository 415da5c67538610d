"""The Spark versions the sink runs on, and what each lacks.

The sink runs on pyspark 4.0 and newer: the produce path, passes, ``state()``, ``log()``,
``read_state`` and the CLI use only what every 4.x release has. A few features are built
on Python APIs that arrived later; on an older Spark they fail by name, with the version
they need (`SparkVersionError`), and everything else keeps working:

=================================================  =========  ================================
feature                                            needs      missing before it
=================================================  =========  ================================
``writeStream.format("compacted-state")``          4.1        ``DataSourceStreamArrowWriter``
``readStream.format("compacted-state")``           4.2        admission control for Python
                                                              streaming sources (``ReadLimit``)
=================================================  =========  ================================

The Arrow schema of a Spark schema (`utc_arrow_schema`) is the same on every version:
timestamps in UTC, as Delta stores them.
"""

from __future__ import annotations

import inspect

import pyarrow as pa
import pyspark
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sinks.errors import CompactedSinkError

SPARK_VERSION: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])  # type: ignore[assignment]

STREAM_WRITER = "writeStream.format('compacted-state')"
STREAM_READER = "readStream.format('compacted-state')"
_NEEDS: dict[str, tuple[int, int]] = {STREAM_WRITER: (4, 1), STREAM_READER: (4, 2)}


class SparkVersionError(CompactedSinkError):
    """Raised when a feature needs a newer Spark than the session's; names both versions and
    what to use instead."""

    def __init__(self, feature: str, needed: tuple[int, int], instead: str) -> None:
        super().__init__(
            f"{feature} needs pyspark {needed[0]}.{needed[1]} or newer; this is pyspark "
            f"{pyspark.__version__}. {instead}"
        )
        self.feature = feature
        self.needed = needed


def supports(feature: str) -> bool:
    """Whether this pyspark has what ``feature`` (`STREAM_WRITER`, `STREAM_READER`) needs."""
    return SPARK_VERSION >= _NEEDS[feature]


def require(feature: str, instead: str) -> None:
    """Raise `SparkVersionError` when this pyspark is older than ``feature`` needs."""
    if not supports(feature):
        raise SparkVersionError(feature, _NEEDS[feature], instead)


_TAKES_TIMEZONE = "timezone" in inspect.signature(to_arrow_schema).parameters


def utc_arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, timestamps in UTC (pyspark 4.2 added the
    ``timezone`` argument; before it a timestamp was always UTC)."""
    if _TAKES_TIMEZONE:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pyspark < 4.2: the stream reader is refused by name (`STREAM_READER`)

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's ``SupportsTriggerAvailableNow`` (a mixin)."""

    class ReadLimit:  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's ``ReadLimit`` so the reader's module imports."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's ``ReadAllAvailable``."""

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's ``ReadMaxRows``."""

        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows
