"""The executors' half of a pass (Kafka's ``Cleaner.cleanSegments`` and
``buildOffsetMap``, run where the files are): `RecopyTask`, the picklable function each
Spark task runs, and the pure packing of partitions into tasks (design.md §33, §42).

The driver's half (choosing, planning, committing) is `sinks.cleaner.cleaner`; readers of
the live state (`sinks.reading.partition_state`) run the same task code without writing.
What a record needs to be kept is `sinks.cleaner.rules`'. Not idempotent: every run
writes new files, which only the pass's commit makes part of the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks.cleaner.offset_map import OffsetMap, canonical_keys, key_buckets
from sinks.cleaner.rules import apply_arrow_tombstone_rules
from sinks.cleaner.throttler import at_lower_priority
from sinks.log.file_reader import conform
from sinks.log.filesystems import arrow_filesystem
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment import Segment
from sinks.log.segment_writer import SegmentWriterTask, nullable_schema
from sinks.python_tasks import freeze_imports

_BIN = "bin"
_Item = TypeVar("_Item")


@dataclass(frozen=True)
class PartitionToClean:
    """What one task cleans: one partition's groups of files, and the files its map covers.

    ``mapped`` are the paths whose records the map is built from, in ``buckets`` scans
    (`sinks.cleaner.offset_map.size_map`); each group (consecutive files, one output
    file each) is recopied in turn.
    """

    partition: int
    mapped: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    size_bytes: int = 0
    buckets: int = 1

    @property
    def probes_keys(self) -> bool:
        """Whether a clean file is recopied by key (its records are not mapped)."""
        mapped = set(self.mapped)
        return any(path not in mapped for group in self.groups for path in group)


def partitions_to_clean(
    mapped: Mapping[int, Sequence[Segment]],
    groups: Mapping[int, Sequence[Sequence[Segment]]],
    buckets: Mapping[int, int] | None = None,
) -> list[PartitionToClean]:
    """The pass's work: one `PartitionToClean` per partition of ``groups``, never split
    over tasks (design.md §33), largest first. Pure."""
    tasks = [
        PartitionToClean(
            partition,
            tuple(s.path for s in mapped.get(partition, [])),
            tuple(tuple(s.path for s in g) for g in runs),
            sum(s.size_bytes for g in runs for s in g),
            (buckets or {}).get(partition, 1),
        )
        for partition, runs in groups.items()
    ]
    return sorted(tasks, key=lambda t: -t.size_bytes)


def packed(
    tasks: Sequence[_Item], slots: int, size: Callable[[_Item], int] = lambda t: t.size_bytes
) -> list[list[int]]:
    """``tasks``' indexes in at most ``slots`` bins (at least one) of about equal ``size``
    (default: bytes), largest first: one Spark task a bin (design.md §33). Pure."""
    bins: list[list[int]] = [[] for _ in range(max(1, min(slots, len(tasks))))]
    loads = [0] * len(bins)
    for index in sorted(range(len(tasks)), key=lambda i: -size(tasks[i])):
        lightest = loads.index(min(loads))
        bins[lightest].append(index)
        loads[lightest] += size(tasks[index])
    return bins


def bin_indexes(batches: Iterator[pa.RecordBatch]) -> list[int]:
    """The bins (`bin_rows`) a Spark task was given. Pure."""
    return [int(b) for batch in batches for b in batch.column(_BIN).to_pylist()]


@dataclass(frozen=True)
class RecopyTask:
    """The picklable function each Spark task of a pass runs (``mapInArrow``).

    Takes Arrow batches of bin indexes (`bin_rows`; each bin lists indexes into
    ``tasks``, `packed`); for each partition of its bins builds the offset map
    (`build_offset_map`) and recopies each group of files into one or more new files of
    at most ``max_file_bytes``, on a thread niced by ``niceness``. Yields the written
    files (``WRITTEN_SEGMENT_DDL`` rows). Raises whatever reading or writing a file
    raises (the pass then fails as a whole). Not idempotent: every run writes new files,
    which only the pass's commit makes part of the log.
    """

    table_uri: str
    storage_options: dict[str, str]
    schema: pa.Schema
    key_columns: tuple[str, ...]
    sequence_column: str | None
    tasks: tuple[PartitionToClean, ...]
    bins: tuple[tuple[int, ...], ...]
    log_start_offsets: dict[int, int]
    pass_start_ms: int
    delete_retention_ms: int
    stats_columns: tuple[str, ...]
    max_file_bytes: int
    niceness: int = 0
    held_below: dict[int, int] = field(default_factory=dict)
    compression: str = "zstd"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Clean the partitions of the bins in ``batches``; yields the written files."""
        freeze_imports()
        writer = SegmentWriterTask(
            table_uri=self.table_uri,
            schema=self.schema,
            stats_columns=self.stats_columns,
            max_file_bytes=self.max_file_bytes,
            group_column=None,
            storage_options=self.storage_options,
            key_columns=self.key_columns,
            compression=self.compression,
        )
        indexes = self.indexes(batches)

        def recopy() -> Iterator[pa.RecordBatch]:
            for index in indexes:
                task = self.tasks[index]
                offset_map = self.build_offset_map(task)
                mapped = set(task.mapped)
                for group in task.groups:
                    yield from writer(self.retained(task.partition, group, offset_map, mapped))

        yield from at_lower_priority(self.niceness, recopy)

    def indexes(self, batches: Iterator[pa.RecordBatch]) -> list[int]:
        """The partitions (indexes into ``tasks``) of the bins this Spark task was given. Pure."""
        return [task for b in bin_indexes(batches) for task in self.bins[b]]

    def newest(self, task: PartitionToClean) -> Iterator[pa.Table]:
        """Each key's newest record of the partition, tombstones included, read file by
        file and not written: what a pass would keep before the tombstone rules.
        Read-only; raises what reading a file raises."""
        offset_map = self.build_offset_map(task)
        mapped = set(task.mapped)
        for group in task.groups:
            yield from self.survivors(task.partition, group, offset_map, mapped)

    def survivors(
        self, partition: int, paths: Sequence[str], offset_map: OffsetMap, mapped: set[str]
    ) -> Iterator[pa.Table]:
        """The records of ``paths`` that are their key's newest, file by file, row group by
        row group, in offset order.

        A mapped file keeps the records that are their key's newest; a clean file (only
        without a sequence column) keeps those whose key the map does not hold.
        """
        for path in paths:
            for table in self.row_groups(path, self.schema, partition):
                if table.num_rows:
                    yield table.filter(pa.array(self.survives(table, offset_map, path in mapped)))

    def survives(self, table: pa.Table, offset_map: OffsetMap, mapped: bool) -> np.ndarray:
        """Per record of ``table`` (one file's, ``mapped`` or clean): whether it is its key's
        newest (a mapped file), or its key has no record in the map (a clean file)."""
        if mapped:
            return offset_map.is_newest(table.column(OFFSET).to_numpy())
        return offset_map.lacks(table.select(self.keys))

    @property
    def keys(self) -> list[str]:
        """The key columns without ``partition`` (each file holds one partition)."""
        return [k for k in self.key_columns if k != PARTITION]

    def build_offset_map(self, task: PartitionToClean) -> OffsetMap:
        """The partition's map, from the narrow columns of its mapped files only: at once,
        or one bucket of keys per scan (design.md §42). Read-only; raises what reading a
        file raises."""
        if task.buckets == 1:
            return self.map_bucket(task, keep_keys=task.probes_keys)
        buckets: list[np.ndarray] = []

        def bucket_of(index: int, canonical: pa.Table) -> np.ndarray:
            if index == len(buckets):
                buckets.append(key_buckets(canonical, task.buckets).astype(np.uint8))
            return buckets[index]

        newest = [
            self.map_bucket(
                task, keep_keys=False, rows=lambda i, c, b=b: bucket_of(i, c) == b
            ).newest
            for b in range(task.buckets)
        ]
        return OffsetMap(np.concatenate(newest))

    def map_bucket(
        self,
        task: PartitionToClean,
        *,
        keep_keys: bool,
        rows: Callable[[int, pa.Table], np.ndarray] | None = None,
    ) -> OffsetMap:
        """The map of the mapped records (only those ``rows`` selects, given the index of a
        row group and its canonical keys), read row group by row group, keys encoded as
        they are read."""
        names = [*self.keys, OFFSET, *([self.sequence_column] if self.sequence_column else [])]
        narrow = pa.schema([self.schema.field(n) for n in names])
        keys, offsets, sequences = [], [], []
        tables = (t for path in task.mapped for t in self.row_groups(path, narrow, task.partition))
        for index, table in enumerate(tables):
            canonical = canonical_keys(table, self.keys, every_validity=True)
            if rows is not None:
                mine = pa.array(rows(index, canonical))
                canonical, table = canonical.filter(mine), table.filter(mine)
            keys.append(canonical)
            offsets.extend(table.column(OFFSET).chunks)
            if self.sequence_column:
                sequences.extend(table.column(self.sequence_column).chunks)
        if not keys:
            empty = canonical_keys(narrow.empty_table(), self.keys, every_validity=True)
            return OffsetMap(np.zeros(0, dtype=np.int64), empty)
        return OffsetMap.build(
            pa.concat_tables(keys),
            pa.chunked_array(offsets, pa.int64()),
            pa.chunked_array(sequences, narrow.field(self.sequence_column).type)
            if self.sequence_column
            else None,
            keep_keys=keep_keys,
        )

    def row_groups(self, path: str, schema: pa.Schema, partition: int) -> Iterator[pa.Table]:
        """The visible records (at or above the log start) of one file of ``partition``, one
        row group at a time, with exactly ``schema``'s columns. Read-only; raises what
        opening or reading the file raises (``FileNotFoundError``, ``OSError``)."""
        fs, root = arrow_filesystem(self.table_uri, self.storage_options)
        floor = self.log_start_offsets.get(partition, 0)
        with fs.open_input_file(f"{root}/{path}") as source:
            parquet = pq.ParquetFile(source)
            present = set(parquet.schema_arrow.names)
            columns = [n for n in schema.names if n in present]
            for index in range(parquet.num_row_groups):
                # Decoded on this (possibly niced) thread, not on Arrow's pool.
                table = parquet.read_row_group(
                    index, columns=columns, use_threads=self.niceness == 0
                )
                if floor > 0 and table.num_rows:
                    table = table.filter(pc.greater_equal(table.column(OFFSET), floor))
                yield _conform(table, schema)

    def retained(
        self, partition: int, group: Sequence[str], offset_map: OffsetMap, mapped: set[str]
    ) -> Iterator[pa.RecordBatch]:
        """The records a group keeps: its `survivors`, then the tombstone rules (KIP-534)."""
        for table in self.survivors(partition, group, offset_map, mapped):
            kept = apply_arrow_tombstone_rules(
                table,
                pass_start_ms=self.pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
                held_below=self.held_below.get(partition),
            )
            yield from kept.to_batches()


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`conform` to ``schema`` with every field nullable, as the files are written."""
    return conform(table, nullable_schema(schema))


def bin_rows(spark: SparkSession, bins: int) -> DataFrame:
    """One row per bin (`packed`), each in a Spark partition of its own: one task a bin."""
    return spark.range(0, bins, 1, bins).select(F.col("id").cast("int").alias(_BIN))
