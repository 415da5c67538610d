"""The Spark versions the sink runs on, and what each lacks.

The sink runs on pyspark 3.5 and newer, whichever distribution provides the ``pyspark``
module (pyspark itself, a platform runtime's, databricks-connect's, pyspark-client's): the
produce path, passes, ``state()``, ``log()``, ``read_state``, the CLI and job files use only
what every release from 3.5 has. Importing this module without a ``pyspark`` module, or with
one older than 3.5, fails at once with `SparkVersionError` naming the supported range (the
package imports it when a Spark name is first used; the Arrow readers never do, and a
pyspark older than 3.5 stops ``import sinks`` itself: `sinks.spark_version`). A few
features are built on Python APIs that arrived later; on an older Spark they fail by name, at
the call, with the version they need (`SparkVersionError`), and everything else keeps working:

=================================================  =========  ================================
feature                                            needs      missing before it
=================================================  =========  ================================
``format("compacted-state")`` (`DATA_SOURCE`)      4.0        Python data sources
                                                              (``pyspark.sql.datasource``)
``writeStream.format("compacted-state")``          4.1        ``DataSourceStreamArrowWriter``
``readStream.format("compacted-state")``           4.2        admission control for Python
                                                              streaming sources (``ReadLimit``)
=================================================  =========  ================================

On a pyspark that lacks them, the data source's base classes are stand-ins defined here, so
the modules that subclass them import everywhere.

The Arrow schema of a Spark schema (`utc_arrow_schema`) is the same on every version:
timestamps in UTC, as Delta stores them.
"""

from __future__ import annotations

import inspect
from typing import Any

import pyarrow as pa

from sinks.errors import SparkVersionError
from sinks.spark_version import check_version, no_pyspark_error

DATA_SOURCE = "format('compacted-state')"
STREAM_WRITER = "writeStream.format('compacted-state')"
STREAM_READER = "readStream.format('compacted-state')"
_NEEDS: dict[str, tuple[int, int]] = {
    DATA_SOURCE: (4, 0),
    STREAM_WRITER: (4, 1),
    STREAM_READER: (4, 2),
}


def check_installed() -> tuple[int, int]:
    """The ``(major, minor)`` of the installed ``pyspark`` module.

    Raises `SparkVersionError` naming the supported range when there is no ``pyspark``
    module or it is older than `MIN_VERSION` (`sinks.spark_version`).
    """
    try:
        import pyspark
    except ImportError as e:
        raise no_pyspark_error() from e
    return check_version(pyspark.__version__)


SPARK_VERSION: tuple[int, int] = check_installed()


def supports(feature: str) -> bool:
    """Whether this pyspark has what ``feature`` (`DATA_SOURCE`, `STREAM_WRITER`,
    `STREAM_READER`) needs."""
    return SPARK_VERSION >= _NEEDS[feature]


def require(feature: str, instead: str) -> None:
    """Raise `SparkVersionError` when this pyspark is older than ``feature`` needs."""
    if not supports(feature):
        raise SparkVersionError(feature, _NEEDS[feature], instead)


from pyspark.sql import types as T  # noqa: E402 - after the check that pyspark is there
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

_TAKES_TIMEZONE = "timezone" in inspect.signature(to_arrow_schema).parameters


def utc_arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, timestamps in UTC (pyspark 4.2 added the
    ``timezone`` argument; before it a timestamp was always UTC)."""
    if _TAKES_TIMEZONE:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


def to_arrow(frame: Any) -> pa.Table:
    """``frame`` (a classic or Connect DataFrame) collected to the driver as an Arrow table:
    ``DataFrame.toArrow`` where pyspark has it (4.0 added it); on pyspark 3.5 the classic
    DataFrame's Arrow collect (what its ``toPandas`` uses), a Connect DataFrame's through
    pandas."""
    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    collect = getattr(frame, "_collect_as_arrow", None)
    if collect is None:
        return pa.Table.from_pandas(frame.toPandas(), preserve_index=False)
    batches = collect()
    if batches:
        return pa.Table.from_batches(batches)
    return utc_arrow_schema(frame.schema).empty_table()


try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )
except ImportError:  # pyspark 3.5: the data source is refused by name (`DATA_SOURCE`)

    class DataSource:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``DataSource`` so the format's module imports."""

        def __init__(self, options: dict[str, str]) -> None:
            self.options = options

    class DataSourceReader:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``DataSourceReader``."""

    class DataSourceStreamReader:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``DataSourceStreamReader``."""

    class DataSourceStreamWriter:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``DataSourceStreamWriter``."""

    class InputPartition:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``InputPartition``."""

        def __init__(self, value: object) -> None:
            self.value = value

    class WriterCommitMessage:  # type: ignore[no-redef]
        """Stands in for pyspark 4.0's ``WriterCommitMessage`` (a dataclass base)."""


try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pyspark < 4.1: the writer is refused by name (`STREAM_WRITER`)
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]


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
