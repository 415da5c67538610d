"""Reading a fetch on the executors, and Kafka's ``offsetsForTimes`` on the driver.

`RangeReader` is what each Spark task runs over a
`streaming.consumers.fetch_plan.ConsumerReadPartition`: the range's records of one
partition, in offset order, read with pyarrow from exactly the files the driver
planned (never a newer snapshot's). `timestamp_positions` finds, per partition, the
first offset at or after a time (``startingTimestamp``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.log import OFFSET, PARTITION, TIMESTAMP, LogSnapshot, arrow_filesystem, conform
from sinks.python_tasks import freeze_imports
from streaming.consumers.consumer_position import FetchRange, Positions, first_offsets_at
from streaming.consumers.fetch_plan import ConsumerReadPartition

_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class RangeReader:
    """The picklable reading each Spark task runs: one partition's files, one offset range."""

    table_uri: str
    schema: pa.Schema

    def __call__(self, partition: ConsumerReadPartition) -> Iterator[pa.RecordBatch]:
        """The range's records in offset order: files whose offsets follow one another
        stream batch by batch (a file wholly inside the range unfiltered by offset);
        overlapping files (rewritten by another engine) are read whole and sorted."""
        freeze_imports()
        fs, root = arrow_filesystem(self.table_uri)
        if partition.ordered:
            for path, whole in zip(partition.paths, partition.whole, strict=True):
                yield from self._file(fs, f"{root}/{path}", partition.fetch, whole)
            return
        tables = [
            pa.Table.from_batches(
                list(self._file(fs, f"{root}/{p}", partition.fetch, False)), self.schema
            )
            for p in partition.paths
        ]
        rows = pa.concat_tables(tables)
        offsets = rows.column(OFFSET).to_numpy()
        if len(offsets) > 1 and not bool(np.all(offsets[1:] > offsets[:-1])):
            rows = rows.take(pc.sort_indices(rows.column(OFFSET)))
        yield from rows.combine_chunks().to_batches(max_chunksize=_BATCH_ROWS)

    def _file(
        self, fs: pa.fs.FileSystem, path: str, fetch: FetchRange, whole: bool
    ) -> Iterator[pa.RecordBatch]:
        with fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source)
            present = [n for n in self.schema.names if n in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=present):
                mask = pc.equal(batch.column(PARTITION), fetch.partition)
                if not whole:
                    offsets = batch.column(OFFSET)
                    mask = pc.and_(
                        mask,
                        pc.and_(
                            pc.greater_equal(offsets, fetch.from_offset),
                            pc.less(offsets, fetch.until_offset),
                        ),
                    )
                if not pc.all(mask).as_py():
                    batch = batch.filter(mask)
                if batch.num_rows:
                    yield conform(batch, self.schema)


def timestamp_positions(snapshot: LogSnapshot, target_ms: int) -> Positions:
    """Per partition, the first offset whose record's timestamp is at or after ``target_ms``.

    Reads the ``offset`` and ``timestamp`` columns of the files whose newest record may
    qualify (from the Delta statistics) on the driver.
    """
    fs, root = arrow_filesystem(snapshot.uri)
    found: dict[int, tuple[list[int], list[int]]] = {}
    for partition, segments in snapshot.segments.items():
        offsets: list[int] = []
        times: list[int] = []
        for segment in segments:
            if segment.max_timestamp_ms is not None and segment.max_timestamp_ms < target_ms:
                continue
            table = pq.read_table(
                f"{root}/{segment.path}", filesystem=fs, columns=[PARTITION, OFFSET, TIMESTAMP]
            )
            table = table.filter(pc.equal(table.column(PARTITION), partition))
            millis = pc.cast(table.column(TIMESTAMP), pa.timestamp("ms", tz="UTC"))
            offsets += table.column(OFFSET).to_pylist()
            times += [
                None if t is None else int(t) for t in pc.cast(millis, pa.int64()).to_pylist()
            ]
        found[partition] = (offsets, times)
    return first_offsets_at(found, target_ms, snapshot.log_end_offsets())
