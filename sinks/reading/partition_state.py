"""The state of the partitions with a dirty tail, read as a pass reads them: no shuffle.

`sinks.reading.state_reader` finds the tail's winners with Spark joins, which shuffle
once the tail is too large to broadcast: with 1e7 dirty records `state()` took 14.7×
Spark's plain read of the live files (``bench/SCALE.md``). A pass never shuffles: each
of its tasks maps one partition where it runs and reads the partition's files once
(`sinks.cleaner.recopy_task.RecopyTask`). This reader runs that task without writing: for each
partition with a dirty section, the offset map of its dirty section (or, in buckets, of
all its records: `sinks.cleaner.offset_map.size_map`), then its files, clean and dirty,
keeping each key's newest record and dropping tombstones. Partitions without a dirty
section are streamed by Spark as before.

It applies when every such partition's map fits ``log.cleaner.dedupe.buffer.size``
whole (a read cannot stop where the map fills, as a pass does) and the log holds no
other engine's files (a pass refuses those too); `partition_state` returns None
otherwise and the joins read the state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from sinks.cleaner.offset_map import size_map
from sinks.cleaner.recopy_task import RecopyTask, bin_rows, packed, partitions_to_clean
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import VALUE
from sinks.log.uris import normalize_uri
from sinks.python_tasks import freeze_imports
from sinks.spark_session import default_parallelism


@dataclass(frozen=True)
class LiveRecordsTask:
    """The picklable function each Spark task runs: bin indexes in, live records out."""

    recopy: RecopyTask
    columns: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        for index in self.recopy.indexes(batches):
            for table in self.recopy.newest(self.recopy.tasks[index]):
                live = table.filter(pc.is_valid(table.column(VALUE))).select(self.columns)
                yield from live.to_batches()


def partition_state(
    spark: SparkSession,
    log_table: LogTable,
    snapshot: LogSnapshot,
    keys: LogKeys,
    partitions: Sequence[int],
    *,
    dedupe_buffer_size: int,
) -> DataFrame | None:
    """The live records (``keys``' columns + ``value``) of ``partitions``, one Spark task per
    core; None when a partition's map would not fit ``dedupe_buffer_size`` whole."""
    mapped, groups, buckets = {}, {}, {}
    for p in partitions:
        inputs = sorted(snapshot.segments.get(p, []))
        cleaner_offset = snapshot.cleaner_offset(p)
        end = snapshot.log_end_offset(p)
        size = size_map(
            inputs,
            first_dirty_offset=cleaner_offset if cleaner_offset is not None else 0,
            cleaner_offset=cleaner_offset,
            keys=keys,
            end_offset=end,
            dedupe_buffer_size=dedupe_buffer_size,
        )
        if size.end_offset < end or not size.fits:
            return None  # a pass would stop short, or map one segment beyond the buffer
        mapped[p], groups[p], buckets[p] = size.mapped, [inputs], size.buckets
    snapshot.check_files([s for runs in groups.values() for s in runs[0]])
    tasks = partitions_to_clean(mapped, groups, buckets)
    columns = (*keys.key_columns, VALUE)
    recopy = RecopyTask(
        table_uri=normalize_uri(log_table.uri),
        storage_options=dict(log_table.location.storage_options),
        schema=snapshot.arrow_schema,
        key_columns=keys.key_columns,
        sequence_column=keys.sequence_column,
        tasks=tuple(tasks),
        bins=tuple(tuple(b) for b in packed(tasks, default_parallelism(spark))),
        log_start_offsets={p: snapshot.log_start_offset(p) for p in partitions},
        pass_start_ms=0,  # not a pass: no tombstone rule runs, nothing is written
        delete_retention_ms=0,
        stats_columns=(),
        max_file_bytes=0,
    )
    fields = {f.name: f for f in snapshot.spark_schema.fields}
    schema = T.StructType([T.StructField(c, fields[c].dataType, True) for c in columns])
    return bin_rows(spark, len(recopy.bins)).mapInArrow(LiveRecordsTask(recopy, columns), schema)
