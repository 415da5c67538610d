"""Reading a snapshot's segments on this process through pyarrow, on every core, no Spark.

`SegmentReader` reads one segment's records with the log's schema (columns a file lacks are
null, types are the log's: `sinks.log.file_reader.conform`), records below their partition's
log start offset dropped. `ordered_map` runs a function over segments on a pool of threads
(pyarrow decodes without holding the GIL) and yields the results in the segments' order,
with at most ``threads`` results ahead of the consumer: memory stays bounded by the largest
segments, whatever the log's size.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sinks.log.file_reader import conform
from sinks.log.location import LogLocation
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment import DataFile
from sinks.log.segment_writer import nullable_schema

if TYPE_CHECKING:
    from sinks.log.log_table import LogSnapshot

# Rows decoded at a time: a row group may hold a whole segment.
BATCH_ROWS = 65_536
_In = TypeVar("_In")
_Out = TypeVar("_Out")


def reader_threads() -> int:
    """Threads a state read uses: one a core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def ordered_map(
    function: Callable[[_In], _Out], items: Iterable[_In], threads: int | None = None
) -> Iterator[_Out]:
    """``function`` of each item, run on ``threads`` threads, yielded in ``items``' order.

    At most ``threads`` calls are pending or done-but-unconsumed at a time. An exception
    raised by a call is raised here when its result is reached; the calls not yet
    consumed are cancelled when the iterator is closed.
    """
    threads = threads or reader_threads()
    pending: deque[Future[_Out]] = deque()
    source = iter(items)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="state-read") as pool:
        try:
            for item in source:
                pending.append(pool.submit(function, item))
                if len(pending) >= threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


@dataclass(frozen=True)
class SegmentReader:
    """Reads a snapshot's segments, a row group at a time, through pyarrow.

    Columns a file lacks are null and types are the log's; records below their
    partition's log start offset (``floors``) are dropped.
    """

    location: LogLocation
    floors: Mapping[int, int]

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> SegmentReader:
        """The reader of ``snapshot``'s segments, with its partitions' log start offsets."""
        starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
        return cls(snapshot.location, {p: s for p, s in starts.items() if s > 0})

    def read(self, segment: DataFile, schema: pa.Schema) -> Iterator[pa.Table]:
        """``segment``'s visible records with exactly ``schema``'s columns, row group by row
        group (empty ones left out)."""
        yield from self.read_kept(segment, schema, None)

    def read_kept(
        self,
        segment: DataFile,
        schema: pa.Schema,
        dropped: Mapping[int, np.ndarray] | None,
        batch_rows: int = BATCH_ROWS,
        row_groups: Sequence[int] | None = None,
        live: str | None = None,
    ) -> Iterator[pa.Table]:
        """`read`, without the records whose offset ``dropped`` lists for their partition
        (sorted offsets), nor those whose ``live`` column (if given) is null, of
        ``row_groups`` (default: all). The partition and offset columns of a row group are
        read first: a row group none of whose records is kept is never decoded further,
        and the other columns are decoded only for a row group that keeps some,
        ``batch_rows`` at a time (one filter a batch drops both kinds)."""
        fs, root = self.location.filesystem()
        wanted = nullable_schema(schema)
        with fs.open_input_file(f"{root}/{segment.path}") as source:
            parquet = pq.ParquetFile(source)
            present = set(parquet.schema_arrow.names)
            position = [n for n in (PARTITION, OFFSET) if n in present]
            rest = [n for n in schema.names if n in present and n not in position]
            indexes = range(parquet.num_row_groups) if row_groups is None else row_groups
            for index in indexes:
                where = parquet.read_row_group(index, columns=position, use_threads=False)
                keep = self._kept(where, dropped)
                if keep is not None and not keep.any():
                    continue
                if not rest:
                    kept = _filtered(conform(where, wanted), keep, live)  # the log's types first
                    if kept.num_rows:
                        yield kept
                    continue
                start = 0
                for batch in parquet.iter_batches(
                    batch_size=batch_rows, row_groups=[index], columns=rest, use_threads=False
                ):
                    table = pa.Table.from_batches([batch])
                    end = start + table.num_rows
                    for name in position:
                        column = where.column(name).slice(start, end - start)
                        table = table.append_column(name, column)
                    # The log's types before filtering: another engine's file may hold types
                    # (string_view) Arrow's take has no kernel for.
                    table = _filtered(
                        conform(table, wanted), None if keep is None else keep[start:end], live
                    )
                    start = end
                    if table.num_rows:
                        yield table

    def row_group_rows(self, segment: DataFile) -> list[int]:
        """The records of each of ``segment``'s row groups, from its footer. Read-only."""
        fs, root = self.location.filesystem()
        with fs.open_input_file(f"{root}/{segment.path}") as source:
            metadata = pq.ParquetFile(source).metadata
            return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]

    def _kept(self, where: pa.Table, dropped: Mapping[int, np.ndarray] | None) -> np.ndarray | None:
        """Per record: at or above its floor and not ``dropped``; None when all are kept."""
        if not self.floors and not dropped:
            return None
        partitions = where.column(PARTITION).to_numpy(zero_copy_only=False)
        offsets = where.column(OFFSET).to_numpy(zero_copy_only=False)
        keep = np.ones(len(offsets), dtype=bool)
        for p in np.unique(partitions):
            here = partitions == p
            floor = self.floors.get(int(p), 0)
            if floor > 0:
                keep &= ~here | (offsets >= floor)
            gone = (dropped or {}).get(int(p))
            if gone is not None and len(gone):
                keep[here] &= ~_among(offsets[here], gone)
        return None if keep.all() else keep

    def read_all(
        self, segments: Sequence[DataFile], schema: pa.Schema, threads: int | None = None
    ) -> pa.Table:
        """Every visible record of ``segments`` in one table, read on ``threads`` threads."""
        tables = [
            t
            for chunk in ordered_map(lambda s: list(self.read(s, schema)), segments, threads)
            for t in chunk
        ]
        return pa.concat_tables(tables) if tables else schema.empty_table()


@dataclass(frozen=True)
class SegmentRowGroup:
    """One row group of one live file: the unit a task reads."""

    segment: DataFile
    index: int
    records: int


def row_groups(
    reader: SegmentReader, segments: Sequence[DataFile], threads: int | None = None
) -> list[SegmentRowGroup]:
    """Every row group of ``segments``, from their footers (read on ``threads`` threads)."""
    counts = ordered_map(reader.row_group_rows, segments, threads)
    return [
        SegmentRowGroup(segment, index, records)
        for segment, rows in zip(segments, counts, strict=True)
        for index, records in enumerate(rows)
    ]


def _filtered(table: pa.Table, keep: np.ndarray | None, live: str | None) -> pa.Table:
    """The rows of ``table`` that ``keep`` keeps (all, when None) whose ``live`` column (if
    given) is not null, in one filter (none when every row stays)."""
    if live is not None and table.column(live).null_count:
        valid = table.column(live).is_valid().to_numpy(zero_copy_only=False)
        keep = valid if keep is None else keep & valid
    return table if keep is None else table.filter(pa.array(keep))


def _among(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Per value: whether ``sorted_set`` (ascending) holds it. Pure."""
    at = np.searchsorted(sorted_set, values)
    at[at == len(sorted_set)] = 0
    return sorted_set[at] == values
