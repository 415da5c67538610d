"""The executor half of an append: validate, assign offsets and write, in one pass over the rows.

Ports what Kafka's leader does to a produce request before it reaches the log
(``LogValidator.validateMessagesAndAssignOffsets``, then the segment append),
as the function one Spark task runs in ``mapInArrow``. The task gets one or more
whole partitions of the batch, sorted by (partition, input order), or by
(partition, offset) for Kafka input; it checks each Arrow batch with
`RecordValidator`, numbers valid rows from the partition's log end offset with
`OffsetAssigner` (Kafka input: drops rows below it), and writes them with
`SegmentWriterTask`. With ``combine.before.append`` the task holds its numbered rows
and writes only the last record of each (partition, key) (`combined`, design.md §44);
the offsets are assigned before, so the dropped ones are gaps. Once a task has seen
an unwritable row it stops writing and only counts, since the driver will discard the batch anyway.

The task sends back two kinds of rows in one schema: a written segment
(``path`` set) and, per partition value it saw, the validator's counts (``path``
null). The driver (`sinks.produce.log_append`) reads them as a `TaskOutput`. The
task never commits: a file it wrote is live only once the driver commits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from sinks.log.latest import latest_offsets
from sinks.log.log_keys import LogKeys
from sinks.log.records import PARTITION
from sinks.log.segment_writer import (
    WRITTEN_ARROW_SCHEMA,
    WRITTEN_SEGMENT_DDL,
    SegmentWriterTask,
    WrittenSegment,
)
from sinks.produce.log_validator import (
    COUNT_COLUMNS,
    BatchReport,
    OffsetAssigner,
    PartitionCounts,
    drop_below_log_end,
)
from sinks.produce.validity import RecordValidator
from sinks.python_tasks import freeze_imports

APPEND_TASK_DDL = WRITTEN_SEGMENT_DDL + "".join(f", {c} long" for c in COUNT_COLUMNS)
_OUTPUT_SCHEMA = pa.schema([*WRITTEN_ARROW_SCHEMA, *[(c, pa.int64()) for c in COUNT_COLUMNS]])


@dataclass(frozen=True)
class AppendTask:
    """The picklable function each Spark task of an append runs (``mapInArrow``).

    ``log_end_offsets`` are the log's, as of the snapshot the append numbers from.
    ``combine`` writes only each (partition, key)'s last record of the task's rows, after
    every row was checked and numbered (design.md §44). Not idempotent: every call writes
    new files. A Spark batch runs the same task in the JVM when it can
    (`sinks.produce.spark_append`, from ``log_schema``), but never a combined one.
    """

    writer: SegmentWriterTask
    log_end_offsets: dict[int, int]
    keys: LogKeys
    has_offsets: bool
    message_max_bytes: int
    log_schema: T.StructType | None = None  # the log's Spark schema: Spark's writer may run it
    combine: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_imports()
        validator = RecordValidator(
            keys=self.keys,
            has_offsets=self.has_offsets,
            message_max_bytes=self.message_max_bytes,
        )
        assigner = OffsetAssigner(self.log_end_offsets)

        def valid_records() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if not validator.validate(batch) or validator.found_problems:
                    continue  # keep counting; the driver discards what was written
                if self.has_offsets:
                    kept = drop_below_log_end(batch, self.log_end_offsets)
                    validator.count_redelivered(batch, kept)
                    yield kept
                else:
                    yield assigner.assign(batch)

        records = valid_records()
        if self.combine:
            records = combined(records, self.keys)
        for written in self.writer(records):
            yield pa.RecordBatch.from_pylist(written.to_pylist(), schema=_OUTPUT_SCHEMA)
        counts = [
            {"partition": p, **{c: getattr(n, c) for c in COUNT_COLUMNS}}
            for p, n in validator.report().partitions.items()
        ]
        if counts:
            yield pa.RecordBatch.from_pylist(counts, schema=_OUTPUT_SCHEMA)


def combined(batches: Iterator[pa.RecordBatch], keys: LogKeys) -> Iterator[pa.RecordBatch]:
    """``batches`` with only the last row of each (partition, key): the rows it supersedes dropped.

    The rows come in each partition's offset order (numbered, or Kafka's sorted), so a key's
    last row is its newest record, the one a pass would keep (design.md §44); a tombstone
    that is last is kept. A log whose latest record follows a ``sequence_column`` is left
    uncombined (its winner is not the last row), and so are keys of a type Arrow's hash
    grouping cannot group (structs, lists): every row written, as without the setting.
    Holds all of ``batches`` at once; the kept rows keep their order. Pure.
    """
    if keys.sequence_column is not None:
        yield from batches
        return
    held = [b for b in batches if b.num_rows]
    if not held:
        return
    table = pa.Table.from_batches(held)
    rows = pa.chunked_array([np.arange(table.num_rows, dtype=np.int64)])
    try:  # a row's number orders a (partition, key)'s records as their offsets do
        _, last = latest_offsets(table.select([*keys.key_columns, PARTITION]), rows)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        yield from table.to_batches()
        return
    yield from table.take(pa.array(np.sort(last))).combine_chunks().to_batches()


@dataclass(frozen=True)
class TaskOutput:
    """What an append's tasks did, as either writer answers the driver.

    ``written`` are the segments written (uncommitted: live only once the driver commits
    them); ``report`` is what the checks counted per partition value.
    """

    written: list[WrittenSegment]
    report: BatchReport

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, object]]) -> TaskOutput:
        """The output of the Python task, from the rows its ``mapInArrow`` sent back. Pure."""
        written, report = read_task_output(rows)
        return cls(written, report)


def read_task_output(
    rows: Iterable[Mapping[str, object]],
) -> tuple[list[WrittenSegment], BatchReport]:
    """The segments the tasks wrote and what their checks found, from their output rows. Pure."""
    written: list[WrittenSegment] = []
    counts: list[tuple[int | None, PartitionCounts]] = []
    segment_fields = WRITTEN_ARROW_SCHEMA.names
    for row in rows:
        if row["path"] is not None:
            written.append(WrittenSegment(**{k: row[k] for k in segment_fields}))
        else:
            partition = row["partition"]
            counts.append((partition, PartitionCounts(**{c: row[c] for c in COUNT_COLUMNS})))
    return written, BatchReport.merged(counts)
