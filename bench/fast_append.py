"""Prototype: the hook's append in one Spark job instead of three (no core edits).

The sink's ``__call__`` today persists the batch, runs `inspect_batch` (a job
that materializes the cache), numbers records with a window (a shuffle and a
sort) and then `write_segments` sorts again and writes (a second job). Here the
batch is shuffled once by partition and sorted once by input order, and each
task checks, numbers and writes its rows in the same ``mapInArrow`` pass; the
task reports its null-key and oversized-value counts beside the files it wrote.
A bad batch is found after writing, so its files are deleted and nothing is
committed: still never half-written, since only the commit makes files live.

Covers the input the benchmark feeds (no Kafka offsets); `FastAppendSink`
falls back to the sink's own path otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from sinks import CompactedStateSink
from sinks.cleaner import stats_columns
from sinks.errors import BadInputError
from sinks.records import INPUT_ORDER, OFFSET, PARTITION, VALUE, check_schema, prepare_batch
from sinks.segment_writer import WRITTEN_SEGMENT_DDL, SegmentWriterTask, WrittenSegment
from sinks.sink import _committed, _without_input_order

_DDL = WRITTEN_SEGMENT_DDL + ", null_keys long, oversized long"


@dataclass(frozen=True)
class NumberingWriterTask:
    """Check, number (from each partition's log end offset) and write one task's rows."""

    writer: SegmentWriterTask
    end_offsets: dict[int, int]
    key_columns: tuple[str, ...]
    message_max_bytes: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = {"null_keys": 0, "oversized": 0}
        next_offset = dict(self.end_offsets)

        def numbered() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                for k in self.key_columns:
                    counts["null_keys"] += batch.column(k).null_count
                value = batch.column(VALUE)
                if pa.types.is_binary(value.type) or pa.types.is_string(value.type):
                    lengths = pc.fill_null(pc.binary_length(value), 0)
                    counts["oversized"] += int(
                        pc.sum(pc.greater(lengths, self.message_max_bytes)).as_py() or 0
                    )
                partitions = batch.column(PARTITION).to_numpy(zero_copy_only=False)
                offsets = np.empty(batch.num_rows, dtype=np.int64)
                for p in np.unique(partitions):
                    where = np.flatnonzero(partitions == p)
                    start = next_offset.get(int(p), 0)
                    offsets[where] = np.arange(start, start + len(where))
                    next_offset[int(p)] = start + len(where)
                index = batch.schema.get_field_index(OFFSET)
                batch = batch.set_column(index, OFFSET, pa.array(offsets))
                yield batch.drop_columns([INPUT_ORDER])

        for out in self.writer(numbered()):
            n = out.num_rows
            yield out.append_column(
                "null_keys", pa.array([counts["null_keys"]] * n, pa.int64())
            ).append_column("oversized", pa.array([counts["oversized"]] * n, pa.int64()))


class FastAppendSink(CompactedStateSink):
    """`CompactedStateSink` whose append is the one-job prototype above."""

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        spark = batch_df.sparkSession
        app_id = self._app_id(spark)
        snapshot = self.log_table.snapshot()
        if snapshot is not None and _committed(snapshot, app_id, batch_id):
            self._finish(batch_id, snapshot, started, skipped=True)
            return
        prepared = prepare_batch(
            batch_df,
            key_columns=self.key_columns,
            sequence_column=self.sequence_column,
            now_ms=self.clock(),
        )
        if prepared.has_offsets:
            return super().__call__(batch_df, batch_id)
        if snapshot is None:
            snapshot = self.log_table.create(_without_input_order(prepared.df).schema)
        check_schema(prepared.df.schema, snapshot.spark_schema)
        task = NumberingWriterTask(
            writer=SegmentWriterTask(
                table_uri=self.path,
                schema=snapshot.arrow_schema,
                stats_columns=tuple(
                    stats_columns(snapshot, self.key_columns, self.sequence_column)
                ),
                max_file_bytes=self.config.segment_bytes,
                group_column=None,
                storage_options=self.storage_options,
            ),
            end_offsets=snapshot.log_end_offsets(),
            key_columns=self.key_columns,
            message_max_bytes=self.config.message_max_bytes,
        )
        rows = (
            prepared.df.repartition(PARTITION)
            .sortWithinPartitions(PARTITION, INPUT_ORDER)
            .mapInArrow(task, _DDL)
            .collect()
        )
        null_keys = sum(r["null_keys"] for r in rows)
        oversized = sum(r["oversized"] for r in rows)
        written = [
            WrittenSegment(
                **{k: v for k, v in r.asDict().items() if k not in ("null_keys", "oversized")}
            )
            for r in rows
        ]
        if null_keys or oversized:
            self._discard(written)
            raise BadInputError(
                f"batch {batch_id}: {null_keys} null keys, {oversized} oversized values; "
                "nothing was written"
            )
        if not written:
            snapshot = self._commit_empty(snapshot, app_id, batch_id)
        else:
            self._commit_append(snapshot, written, app_id, batch_id)
            snapshot = self._refreshed(snapshot)
        self._finish(batch_id, snapshot, started, skipped=False, written=written)
