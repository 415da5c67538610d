"""The state in Spark, read by tasks a row group at a time, less the superseded records.

    state = live files ▷ superseded, tombstones dropped

`sinks.reading.superseded` finds, on the driver and from the narrow columns alone, which
records a newer record of their key supersedes (design.md §50). What is left is a scan:
every row group of every live file of the partitions with a dirty section is an item of
work, the items are packed into one bin a core by records (`packed`, as a pass's tasks
are), and each Spark task reads its bin's row groups through pyarrow (`SegmentReader.read_kept`),
dropping the superseded records and the tombstones. A key's records need not meet in
one task: which of them wins is already decided. So a partition's read runs on every
core, however few partitions the log has, and a row group every record of which is
superseded is never decoded beyond its offsets.

The tasks carry the superseded offsets (8 bytes a record) in their function, which Spark
ships once an executor; nothing is shuffled or joined. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.cleaner.recopy_task import bin_indexes, bin_rows, packed
from sinks.log.records import OFFSET, PARTITION, VALUE
from sinks.log.segment import DataFile
from sinks.python_tasks import freeze_imports
from sinks.reading.segment_reader import SegmentReader, SegmentRowGroup, row_groups

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T


@dataclass(frozen=True)
class KeptRecordsTask:
    """The picklable function each Spark task runs: bin indexes in, the bins' kept records out
    (``columns``: the key columns and ``value``, tombstones dropped)."""

    reader: SegmentReader
    schema: pa.Schema  # what is read: ``columns``, ``partition`` and ``offset``
    columns: tuple[str, ...]
    superseded: Mapping[int, np.ndarray]
    bins: tuple[tuple[SegmentRowGroup, ...], ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        for b in bin_indexes(batches):
            for unit in self.bins[b]:
                yield from self.read(unit)

    def read(self, unit: SegmentRowGroup) -> Iterator[pa.RecordBatch]:
        """``unit``'s records that are neither superseded nor tombstones."""
        tables = self.reader.read_kept(
            unit.segment, self.schema, self.superseded, row_groups=[unit.index]
        )
        for table in tables:
            live = table.filter(pc.is_valid(table.column(VALUE))).select(self.columns)
            yield from live.to_batches()


def kept_records(
    spark: SparkSession,
    reader: SegmentReader,
    log_schema: pa.Schema,
    out: T.StructType,
    segments: Sequence[DataFile],
    superseded: Mapping[int, np.ndarray],
    slots: int,
) -> DataFrame:
    """The records of ``segments`` less ``superseded`` (each partition's sorted offsets) and
    less the tombstones, with ``out``'s columns (key columns and ``value``, of the log's
    types), read by at most ``slots`` Spark tasks."""
    columns = tuple(out.fieldNames())
    read = pa.schema([log_schema.field(n) for n in dict.fromkeys([*columns, PARTITION, OFFSET])])
    units = row_groups(reader, segments)
    bins = tuple(tuple(units[i] for i in b) for b in packed(units, slots, size=lambda u: u.records))
    task = KeptRecordsTask(reader, read, columns, dict(superseded), bins)
    return bin_rows(spark, len(bins)).mapInArrow(task, out)
