"""Kafka's ``cleanSegments``: recopy each input segment once, keeping what the offset map allows.

Kafka's cleaner, given the offset map of the dirty section, reads every segment
of a group once and writes the records it retains into one new segment: a record
with key K and offset O is kept unless the map holds an offset O' > O for K
(`sinks.cleaner.offset_map` says why the map over the dirty section suffices).
Tombstones follow KIP-534 here as in `sinks.cleaner.cleaner.apply_tombstone_rules`:
one whose delete horizon lies before the pass's start goes; one without a horizon
is stamped with ``pass_start_ms + delete_retention_ms``.

Each output group (consecutive segments of one partition, `group_segments_by_size`)
is read, filtered and written by one Spark task with pyarrow: no Spark row ever
carries a value, nothing is shuffled, and each input byte is read once. The map
reaches the tasks inside the task function (Spark broadcasts a large one); each
task indexes its partition's keys once (a pandas hash index) and probes it file
by file. Not idempotent: every call writes new files, which only a commit makes
part of the log (a crash leaves orphans for recovery).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sinks.cleaner.cpu_priority import at_lower_priority
from sinks.cleaner.offset_map import visible
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE
from sinks.log.segment import Segment
from sinks.log.segment_writer import (
    WRITTEN_SEGMENT_DDL,
    SegmentWriterTask,
    WrittenSegment,
    nullable_schema,
)
from sinks.log.storage import arrow_filesystem, normalize_uri

_GROUP = "group"


def to_ipc(table: pa.Table) -> bytes:
    """An Arrow table as compressed IPC stream bytes (what a task function carries)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def retained_mask(
    offsets: np.ndarray, positions: np.ndarray, map_offsets: np.ndarray
) -> np.ndarray:
    """Kafka's retain rule: keep a record unless the map holds a newer offset for its key.

    ``positions`` is each record's index into ``map_offsets`` (-1: key not in the map).
    """
    found = positions >= 0
    newer = np.zeros(len(offsets), dtype=bool)
    newer[found] = map_offsets[positions[found]] > offsets[found]
    return ~newer


def apply_tombstone_rules(
    table: pa.Table, *, pass_start_ms: int, delete_retention_ms: int, held_below: int | None = None
) -> pa.Table:
    """KIP-534 over Arrow rows of one partition: drop expired tombstones, stamp unstamped ones.

    An expired tombstone at or above ``held_below`` stays (`sinks.cleaner.consumer_holds`).
    """
    tombstone = pc.is_null(table.column(VALUE))
    horizon = table.column(DELETE_HORIZON_MS)
    expired = pc.and_(
        tombstone, pc.fill_null(pc.less(horizon, pa.scalar(pass_start_ms, pa.int64())), False)
    )
    if held_below is not None:
        expired = pc.and_(expired, pc.less(table.column(OFFSET), held_below))
    if pc.any(expired).as_py():
        table = table.filter(pc.invert(expired))
        tombstone = pc.is_null(table.column(VALUE))
        horizon = table.column(DELETE_HORIZON_MS)
    unstamped = pc.and_(tombstone, pc.is_null(horizon))
    if not pc.any(unstamped).as_py():
        return table
    stamp = pa.scalar(pass_start_ms + delete_retention_ms, horizon.type)
    index = table.schema.get_field_index(DELETE_HORIZON_MS)
    return table.set_column(index, table.schema.field(index), pc.if_else(unstamped, stamp, horizon))


class KeyIndex:
    """A hash index over one partition's map keys: position of each key, built once."""

    def __init__(self, keys: pa.Table) -> None:
        columns = [_as_numpy(c) for c in keys.columns]
        self._index = (
            pd.Index(columns[0]) if len(columns) == 1 else pd.MultiIndex.from_arrays(columns)
        )

    def positions(self, keys: pa.Table) -> np.ndarray:
        columns = [_as_numpy(c) for c in keys.columns]
        probe = columns[0] if len(columns) == 1 else pd.MultiIndex.from_arrays(columns)
        return np.asarray(self._index.get_indexer(probe), dtype=np.int64)


def _as_numpy(column: pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class RecopyTask:
    """The picklable function each Spark task runs: group indexes in, written segments out."""

    table_uri: str
    storage_options: dict[str, str]
    schema: pa.Schema
    key_columns: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    log_start_offsets: dict[int, int]
    offset_map: bytes
    pass_start_ms: int
    delete_retention_ms: int
    stats_columns: tuple[str, ...]
    max_file_bytes: int
    niceness: int = 0
    held_below: dict[int, int] = field(default_factory=dict)
    _indexes: dict[int, tuple[KeyIndex, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = SegmentWriterTask(
            table_uri=self.table_uri,
            schema=self.schema,
            stats_columns=self.stats_columns,
            max_file_bytes=self.max_file_bytes,
            group_column=None,
            storage_options=self.storage_options,
        )
        groups = [int(g) for batch in batches for g in batch.column(_GROUP).to_pylist()]

        def recopy() -> Iterator[pa.RecordBatch]:
            offset_map = from_ipc(self.offset_map)
            for group in groups:
                yield from writer(self.retained(group, offset_map))

        yield from at_lower_priority(self.niceness, recopy)

    def retained(self, group: int, offset_map: pa.Table) -> Iterator[pa.RecordBatch]:
        """The records group ``group`` keeps, file by file, in offset order."""
        fs, root = arrow_filesystem(self.table_uri, self.storage_options)
        keys = [k for k in self.key_columns if k != PARTITION]
        for path in self.groups[group]:
            with fs.open_input_file(f"{root}/{path}") as source:
                # Decoded on this (possibly niced) thread, not on Arrow's pool.
                table = _conform(pq.read_table(source, use_threads=self.niceness == 0), self.schema)
            table = visible(table, self.log_start_offsets)
            if table.num_rows == 0:
                continue
            partition = int(table.column(PARTITION)[0].as_py())
            index, map_offsets = self._index(partition, offset_map, keys)
            keep = retained_mask(
                _as_numpy(table.column(OFFSET)), index.positions(table.select(keys)), map_offsets
            )
            kept = apply_tombstone_rules(
                table.filter(pa.array(keep)),
                pass_start_ms=self.pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
                held_below=self.held_below.get(partition),
            )
            yield from kept.to_batches()

    def _index(
        self, partition: int, offset_map: pa.Table, keys: Sequence[str]
    ) -> tuple[KeyIndex, np.ndarray]:
        if partition not in self._indexes:
            mine = offset_map.filter(pc.equal(offset_map.column(PARTITION), partition))
            self._indexes.clear()  # a group holds one partition: keep one index at a time
            self._indexes[partition] = (KeyIndex(mine.select(keys)), _as_numpy(mine[OFFSET]))
        return self._indexes[partition]


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Exactly ``schema``'s columns, in order: missing ones null, types cast.

    Files of several schemas (a log whose schema evolved) give one: Arrow casts struct
    fields by name, fills the fields a file lacks with null and widens its types. Every
    field becomes nullable, as the files are written (see `nullable_schema`).
    """
    schema = nullable_schema(schema)
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.schema.names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def clean_segments(
    spark: SparkSession,
    groups: Sequence[Sequence[Segment]],
    offset_map: pa.Table,
    *,
    table_uri: str,
    schema: pa.Schema,
    key_columns: Sequence[str],
    log_start_offsets: Mapping[int, int],
    pass_start_ms: int,
    delete_retention_ms: int,
    stats_columns: Sequence[str],
    max_file_bytes: int,
    storage_options: Mapping[str, str] | None = None,
    max_tasks: int | None = None,
    niceness: int = 0,
    held_below: Mapping[int, int] | None = None,
) -> list[WrittenSegment]:
    """Recopy every group once, one Spark task per group (at most ``max_tasks`` tasks,
    each then recopying several groups in turn, on a thread niced by ``niceness``);
    returns the files written."""
    task = RecopyTask(
        table_uri=normalize_uri(table_uri),
        storage_options=dict(storage_options or {}),
        schema=schema,
        key_columns=tuple(key_columns),
        groups=tuple(tuple(s.path for s in g) for g in groups),
        log_start_offsets=dict(log_start_offsets),
        offset_map=to_ipc(offset_map),
        pass_start_ms=pass_start_ms,
        delete_retention_ms=delete_retention_ms,
        stats_columns=tuple(stats_columns),
        max_file_bytes=max_file_bytes,
        niceness=niceness,
        held_below=dict(held_below or {}),
    )
    slices = min(len(groups), max_tasks or len(groups))
    tasks = spark.range(0, len(groups), 1, slices).select(F.col("id").cast("int").alias(_GROUP))
    rows = tasks.mapInArrow(task, WRITTEN_SEGMENT_DDL).collect()
    return [WrittenSegment(**row.asDict()) for row in rows]
