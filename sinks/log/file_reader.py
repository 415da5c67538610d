"""Reading log segments on executors through pyarrow, for stores Spark cannot open.

The read-side twin of `segment_writer`: Spark's Parquet reader needs a Hadoop
file system for the URI (``s3a://`` needs hadoop-aws, ``abfss://`` hadoop-azure,
``gs://`` the GCS connector), which a plain pyspark install lacks. Here the driver
only builds a small DataFrame of file paths; each Spark task opens its files with
pyarrow's file system for the table URI (`storage.arrow_filesystem`, credentials
from the task's options and its own environment) and streams their rows as Arrow
batches. Nothing here touches driver-only state, and the result has exactly the
requested schema whatever the schema each file was written with.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.log.location import LogLocation
from sinks.log.records import RecordsT
from sinks.log.segment_writer import nullable_schema
from sinks.log.uris import normalize_uri
from sinks.python_tasks import freeze_imports

if TYPE_CHECKING:  # the Arrow readers import this module without pyspark (design.md §59)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_PATH = "path"
_BATCH_ROWS = 65_536


def read_files(
    spark: SparkSession, location: LogLocation, paths: Sequence[str], schema: StructType
) -> DataFrame:
    """The rows of Parquet ``paths`` (relative to the table at ``location``) as one DataFrame
    of ``schema``.

    Files are spread over tasks (up to the default parallelism); each task reads
    its files whole, in order. Columns a file lacks are null; extra columns are
    dropped. Lazy like any DataFrame: files are opened when an action runs, so a
    file deleted before then fails that action with ``FileNotFoundError``.
    """
    from sinks.spark_compat import utc_arrow_schema

    if not paths:
        return spark.createDataFrame([], schema)
    arrow_schema = nullable_schema(utc_arrow_schema(schema))
    # Here: executors resolve a relative path against their own cwd.
    table = LogLocation(normalize_uri(location.uri), dict(location.storage_options))
    task = ParquetReaderTask(table=table, schema=arrow_schema)
    listing = spark.createDataFrame([(p,) for p in paths], f"{_PATH} string")
    return listing.mapInArrow(task, schema)


@dataclass(frozen=True)
class ParquetReaderTask:
    """The picklable function each Spark task runs: paths in, the files' rows out."""

    table: LogLocation
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        fs, root = self.table.filesystem()
        for batch in batches:
            for path in batch.column(_PATH).to_pylist():
                with fs.open_input_file(f"{root}/{path}") as source:
                    parquet = pq.ParquetFile(source)
                    present = [n for n in self.schema.names if n in parquet.schema_arrow.names]
                    for rows in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=present):
                        yield conform(rows, self.schema)


def conform(records: RecordsT, schema: pa.Schema) -> RecordsT:
    """Exactly ``schema``'s columns, in order: missing ones null, types cast. Pure.

    Files of several schemas (a log whose schema evolved) read as one: Arrow casts
    struct fields by name, fills the fields a file lacks with null and widens types.
    """
    columns = [
        records.column(f.name).cast(f.type)
        if f.name in records.schema.names
        else pa.nulls(records.num_rows, f.type)
        for f in schema
    ]
    return type(records).from_arrays(columns, schema=schema)
