"""Writing log segments on executors: Parquet files plus the Delta statistics of each.

The executor-side half of Kafka's segment append: each Spark task writes the
rows it holds, already sorted by (partition, offset), into Parquet files under
the table, one or more per partition (and per output group for a cleaner pass),
rolling to a new file past ``max_file_bytes``. The driver receives only small
descriptions of the written files and commits them; a file no commit names is
an orphan that recovery removes. Nothing here touches driver-only state.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from sinks.log.key_filter import (
    KEY_FILTER_OFF_ENV,
    key_filter_options,
    page_index_options,
    pyarrow_writes_key_filters,
)
from sinks.log.location import LogLocation
from sinks.log.log_keys import LogKeys
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION
from sinks.log.segment import segment_path
from sinks.python_tasks import freeze_imports

if TYPE_CHECKING:  # the Arrow readers import this module without pyspark (design.md §59)
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

WRITTEN_SEGMENT_DDL = (
    "path string, size_bytes long, partition int, base_offset long, last_offset long, "
    "num_records long, stats string"
)
WRITTEN_ARROW_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size_bytes", pa.int64()),
        ("partition", pa.int32()),
        ("base_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("num_records", pa.int64()),
        ("stats", pa.string()),
    ]
)
"""The same columns in Arrow: what a writer task sends the driver."""
_FLUSH_ROWS = 131_072
_FLUSH_BYTES = 64 * 1024 * 1024
_STRING_STATS_PREFIX = 32  # Delta's default truncation for string statistics


@dataclass(frozen=True)
class WrittenSegment:
    """A Parquet file an executor wrote, described for the driver's commit."""

    path: str
    size_bytes: int
    partition: int
    base_offset: int
    last_offset: int
    num_records: int
    stats: str

    def add_action(self, *, data_change: bool, modification_time: int) -> AddAction:
        """The Delta add action for this file (``data_change=False`` for a cleaner's rewrite)."""
        return AddAction(self.path, self.size_bytes, {}, modification_time, data_change, self.stats)


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field, array element and map value nullable, at every depth."""
    return pa.schema([_nullable_field(f) for f in schema], metadata=schema.metadata)


def _nullable_field(field: pa.Field) -> pa.Field:
    return field.with_type(_nullable_type(field.type)).with_nullable(True)


def _nullable_type(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(data_type):
        return pa.struct([_nullable_field(data_type.field(i)) for i in range(data_type.num_fields)])
    if pa.types.is_map(data_type):
        return pa.map_(data_type.key_field, _nullable_field(data_type.item_field))
    if pa.types.is_large_list(data_type):
        return pa.large_list(_nullable_field(data_type.value_field))
    if pa.types.is_list(data_type):
        return pa.list_(_nullable_field(data_type.value_field))
    return data_type


def write_segments(
    df: DataFrame,
    *,
    location: LogLocation,
    schema: pa.Schema,
    stats_columns: Sequence[str],
    max_file_bytes: int,
    group_column: str | None = None,
    compression: str = "zstd",
) -> list[WrittenSegment]:
    """Write ``df`` (already partitioned so each task holds whole partitions) as segments
    of the log at ``location``.

    Each task sorts its rows by (partition, group, offset) and writes one file per
    partition and group, or more when a file passes ``max_file_bytes``. ``schema``
    is the log's Arrow schema; ``group_column`` is dropped before writing.
    Not idempotent: every call writes new files.
    """
    order = ["partition", *([group_column] if group_column else []), "offset"]
    task = SegmentWriterTask(
        table_uri=location.uri,
        schema=schema,
        stats_columns=tuple(stats_columns),
        max_file_bytes=max_file_bytes,
        group_column=group_column,
        storage_options=dict(location.storage_options),
        compression=compression,
    )
    rows = df.sortWithinPartitions(*order).mapInArrow(task, WRITTEN_SEGMENT_DDL).collect()
    return [WrittenSegment(**row.asDict()) for row in rows]


@dataclass(frozen=True)
class SegmentWriterTask:
    """The picklable function each Spark task runs (``mapInArrow``).

    ``table_uri`` and ``storage_options`` are the log's `location`, kept apart only because
    the cleaner's `RecopyTask` builds this task from its own two fields (design.md §70)."""

    table_uri: str
    schema: pa.Schema
    stats_columns: tuple[str, ...]
    max_file_bytes: int
    group_column: str | None
    storage_options: Mapping[str, str]
    key_columns: tuple[str, ...] = ()
    """The columns each row group carries a key filter on (`sinks.log.key_filter`)."""
    compression: str = "zstd"
    """The Parquet codec, as pyarrow names it (`CleanerConfig.parquet_codec`)."""

    @property
    def location(self) -> LogLocation:
        """Where the log the files are written for lives."""
        return LogLocation(self.table_uri, self.storage_options)

    @cached_property
    def file_schema(self) -> pa.Schema:
        """What files are written with: ``schema`` with every field nullable at every depth.

        A tombstone's null ``value`` holds nulls in the fields the log declares required,
        which Arrow refuses to cast to a required field; the log's Delta schema keeps
        saying required, and readers read the file as the log's schema.
        """
        return nullable_schema(self.schema)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        fs, root = self.location.filesystem()
        written: list[dict[str, Any]] = []
        current: _OpenSegment | None = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for run_key, rows in self._runs(pa.Table.from_batches([batch])):
                if current is not None and current.run_key != run_key:
                    written.append(current.close())
                    current = None
                if current is None:
                    current = _OpenSegment(fs, root, run_key, rows, self)
                current.write(rows)
                if current.size_bytes >= self.max_file_bytes:
                    written.append(current.close())
                    current = None
        if current is not None:
            written.append(current.close())
        if written:
            yield pa.RecordBatch.from_pylist(written, schema=WRITTEN_ARROW_SCHEMA)

    def _runs(self, table: pa.Table) -> Iterator[tuple[tuple[int, ...], pa.Table]]:
        """Split sorted rows into runs of one (partition, group) each."""
        keys = [table.column("partition").to_numpy(zero_copy_only=False)]
        if self.group_column:
            keys.append(table.column(self.group_column).to_numpy(zero_copy_only=False))
            table = table.drop_columns([self.group_column])
        table = table.select(self.schema.names).cast(self.file_schema)
        change = np.zeros(table.num_rows, dtype=bool)
        for key in keys:
            change[1:] |= key[1:] != key[:-1]
        bounds = [0, *np.flatnonzero(change).tolist(), table.num_rows]
        for start, end in zip(bounds, bounds[1:], strict=False):
            yield tuple(int(k[start]) for k in keys), table.slice(start, end - start)


class _OpenSegment:
    """One Parquet file being written, with its running statistics."""

    def __init__(
        self, fs: Any, root: str, run_key: tuple[int, ...], first: pa.Table, task: SegmentWriterTask
    ) -> None:
        self.run_key = run_key
        self.partition = run_key[0]
        self.base_offset = int(first.column("offset")[0].as_py())
        self.path = segment_path(self.partition, self.base_offset, uuid.uuid4().hex)
        self._fs, self._root, self._task = fs, root, task
        fs.create_dir(f"{root}/partition-{self.partition}", recursive=True)
        self._stream = fs.open_output_stream(f"{root}/{self.path}")
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = self._pending_bytes = 0
        self._stats = _RunningStats(task.schema, task.stats_columns)
        self.size_bytes = 0

    def write(self, rows: pa.Table) -> None:
        self._stats.update(rows)
        self._pending.append(rows)
        self._pending_rows += rows.num_rows
        self._pending_bytes += rows.nbytes
        if self._pending_rows >= _FLUSH_ROWS or self._pending_bytes >= min(
            _FLUSH_BYTES, self._task.max_file_bytes
        ):
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            if self._writer is None:
                self._writer = self._open_writer(self._pending_rows)
            self._writer.write_table(pa.concat_tables(self._pending))
            self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
            self.size_bytes = self._stream.tell()

    def _open_writer(self, rows: int) -> pq.ParquetWriter:
        """The file's writer, opened at the first flush: its key filters are sized for the
        first row group, which is the largest but for a rare byte-bound flush; with the
        page index and small pages (`page_index_options`, design.md §38)."""
        task = self._task
        filters = key_filter_options(task.file_schema, task.key_columns, min(rows, _FLUSH_ROWS))
        if os.environ.get(KEY_FILTER_OFF_ENV):
            filters = {}  # only to measure the filter's cost (bench/lookup_pass.py)
        options = page_index_options()
        if filters and pyarrow_writes_key_filters():  # pyarrow < 24 writes none
            options["bloom_filter_options"] = filters
        codec = task.compression
        return pq.ParquetWriter(self._stream, task.file_schema, compression=codec, **options)

    def close(self) -> dict[str, Any]:
        self._flush()
        if self._writer is None:
            self._writer = self._open_writer(1)
        self._writer.close()
        self._stream.close()
        size = self._fs.get_file_info(f"{self._root}/{self.path}").size
        return {
            "path": self.path,
            "size_bytes": size,
            "partition": self.partition,
            "base_offset": self.base_offset,
            "last_offset": self._stats.maximum["offset"],
            "num_records": self._stats.num_records,
            "stats": self._stats.to_json(),
        }


class _RunningStats:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount), built batch by batch."""

    def __init__(self, schema: pa.Schema, columns: Sequence[str]) -> None:
        self.num_records = 0
        self._min_max = [c for c in columns if _has_min_max(schema.field(c).type)]
        names = [*columns, *([] if "value" in columns else ["value"])]
        self._null_counted = [
            c for c in names if c in schema.names and not pa.types.is_nested(schema.field(c).type)
        ]
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}
        self.null_count: dict[str, Any] = dict.fromkeys(self._null_counted, 0)

    def update(self, rows: pa.Table) -> None:
        self.num_records += rows.num_rows
        for name in self._null_counted:
            self.null_count[name] += rows.column(name).null_count
        for name in self._min_max:
            column = rows.column(name)
            if column.null_count == len(column):
                continue
            bounds = pc.min_max(column).as_py()
            lo, hi = bounds["min"], bounds["max"]
            self.minimum[name] = lo if name not in self.minimum else min(self.minimum[name], lo)
            self.maximum[name] = hi if name not in self.maximum else max(self.maximum[name], hi)

    def to_json(self) -> str:
        minimum = _stat_values(self.minimum, low=True)
        maximum = _stat_values(self.maximum, low=False)
        return json.dumps(
            {
                "numRecords": self.num_records,
                "minValues": minimum,
                "maxValues": maximum,
                "nullCount": self.null_count,
            },
            separators=(",", ":"),
        )


def stats_from_footer(
    metadata: pq.FileMetaData, schema: pa.Schema, columns: Sequence[str]
) -> _RunningStats:
    """The Delta statistics of a Parquet file another writer wrote (Spark's), from its footer.

    The same statistics `_OpenSegment` keeps while writing, for top-level columns; a
    minimum or maximum the footer does not state exactly is left out (Delta allows it),
    and so are floating-point ones (writers differ on NaN).
    """
    stats = _RunningStats(schema, columns)
    stats.num_records = metadata.num_rows
    chunks: dict[str, list[Any]] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            chunks.setdefault(chunk.path_in_schema, []).append(chunk.statistics)
    for name in stats.null_count:
        found = chunks.get(name)
        if found is None or any(s is None or not s.has_null_count for s in found):
            stats.null_count[name] = None
        else:
            stats.null_count[name] = sum(s.null_count for s in found)
    for name in stats._min_max:
        found = chunks.get(name, [])
        if pa.types.is_floating(schema.field(name).type):
            continue
        known = [s for s in found if s is not None and s.has_min_max]
        if not found or len(known) != len(found):
            continue
        if not all(getattr(s, "is_min_value_exact", True) for s in known):
            continue
        stats.minimum[name] = min(_footer_value(s.min) for s in known)
        if all(getattr(s, "is_max_value_exact", True) for s in known):
            stats.maximum[name] = max(_footer_value(s.max) for s in known)
    stats.null_count = {k: v for k, v in stats.null_count.items() if v is not None}
    return stats


def _footer_value(value: Any) -> Any:
    """A footer statistic as `pc.min_max` gives it (timestamps as UTC datetimes)."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _has_min_max(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_timestamp(arrow_type)
        or pa.types.is_date(arrow_type)
    )


def _stat_values(values: Mapping[str, Any], *, low: bool) -> dict[str, Any]:
    """The statistics that can be stated safely, in Delta's JSON form."""
    stated = {name: stat_value(value, low=low) for name, value in values.items()}
    return {name: value for name, value in stated.items() if value is not None}


def stat_value(value: Any, *, low: bool) -> Any:
    """A statistic in Delta's JSON form; None when it cannot be stated safely."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if not low and millis != value:
            millis += dt.timedelta(milliseconds=1)  # a maximum may only be rounded up
        return millis.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        if len(value) <= _STRING_STATS_PREFIX:
            return value
        return value[:_STRING_STATS_PREFIX] if low else None  # a truncated maximum would lie
    if isinstance(value, float) and value != value:
        return None
    return value


def stats_columns(schema: StructType, keys: LogKeys) -> list[str]:
    """The columns of the log's ``schema`` whose min/max/null counts go into each file's stats."""
    names = [*keys.key_columns, PARTITION, OFFSET, "timestamp", DELETE_HORIZON_MS]
    if keys.sequence_column:
        names.append(keys.sequence_column)
    present = set(schema.names)
    return [n for n in dict.fromkeys(names) if n in present]
