"""The state without Spark: Kafka's "consume the compacted topic from the start", on Arrow.

A service rebuilding its cache, a notebook on a laptop, DuckDB or Polars read a
log's state with delta-rs and pyarrow alone, no JVM, resolved exactly as
`CompactedStateSink.state` resolves it (`sinks.reading.state_reader`):

    state = (clean ▷ keys(dirty)) ∪ latest(dirty), tombstones dropped

Which segments are clean is `log_sections`' answer for the snapshot (files another
engine wrote are always dirty),
the same function `state()` asks. Only the dirty tail's narrow columns
(partition, key columns, the sequence column, offset) are held in memory, as the
*winners*: each (partition, key)'s latest offset there (with a ``sequence_column``,
the highest (sequence, offset), clean records of the tail's keys competing too).
Then every segment is read once, batch by batch: a clean record is kept unless a
tail key beats it, a dirty record only at its key's winning offset, and
tombstones are dropped. Records below a partition's log start offset
(``compacted-sink/log-start-offset/<p>``) are invisible, as in ``log()``.
Memory is bounded by the tail's distinct keys, never by the clean section, so
`read_state_batches` serves states larger than memory.

Rows carry the key columns, ``value`` and the payload columns (every other input
column the log keeps, such as Kafka's ``topic`` or ``headers``), in the log's
order, with the log's types; not the metadata (``partition``, ``offset``,
``timestamp``) nor the cleaner's ``delete_horizon_ms``. ``state()`` returns the
key columns and ``value`` of the same rows. The log's key columns and sequence
column come from the log itself (`sinks.log.log_keys`), so a reader needs only
the path. Reads only; idempotent: another engine's stale rewrite of the log (an OPTIMIZE
planned before a pass and committed after it, `sinks.log.foreign.stale_rewrites`) is read through,
as the sink's undo leaves the log, not undone here; one that cannot be undone exactly
raises `ForeignChangeError`, as ``state()`` does. Key columns must be of types Arrow's hash join
groups by (strings, binaries, numbers, dates, timestamps, decimals), not structs
or lists; values and payload may be of any type.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.cleaner.rules import arrow_latest_offsets
from sinks.log.file_reader import ParquetReaderTask
from sinks.log.log_keys import LogKeys, log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable
from sinks.log.ownership import check_new_log_location
from sinks.log.records import (
    DELETE_HORIZON_MS,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    VALUE,
    at_or_above,
)
from sinks.log.segment import DataFile
from sinks.log.storage import LogLocation, normalize_uri
from sinks.reading.state_reader import LogSections, log_sections

DEFAULT_BATCH_ROWS = 65_536
_PATH = "path"
_ROW = "_row"


def read_state(
    path: str, as_of: AsOf | None = None, storage_options: Mapping[str, str] | None = None
) -> pa.Table:
    """One row per live key of the log at ``path``: key columns, ``value``, payload columns.

    ``as_of`` (a Delta version, or a timestamp) reads the log as it was then, as
    ``state(as_of=...)`` does; outside the history window it raises the sink's
    time-travel error. ``storage_options`` use delta-rs's names. Raises
    `FileNotFoundError` when no log exists at ``path``. The whole state is built in
    memory; for larger states use `read_state_batches`. A live data file that is gone or
    truncated raises `MissingDataFileError` / `CorruptDataFileError` before any is read.
    """
    return read_state_batches(path, as_of, storage_options).read_all()


def read_state_batches(
    path: str,
    as_of: AsOf | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> pa.RecordBatchReader:
    """`read_state`'s rows as a stream of record batches of at most ``batch_rows`` rows.

    The winners of the dirty tail are computed before the reader is returned (the
    snapshot is pinned then: later commits do not show); segments are opened one at
    a time as the reader is consumed. A segment deleted meanwhile (outside the
    history window) fails the read with ``FileNotFoundError``.
    """
    log = LogTable(normalize_uri(path), storage_options)
    snapshot = log.snapshot(as_of, repair=False)
    if snapshot is None:
        check_new_log_location(log.location, read_only=True)  # someone else's files
        raise FileNotFoundError(f"no compacted log at {path}")
    plan = StatePlan.of(snapshot)
    return pa.RecordBatchReader.from_batches(plan.schema, plan.batches(batch_rows))


def state_schema(log_schema: pa.Schema, keys: LogKeys) -> pa.Schema:
    """The columns of the state: key columns, ``value``, then payload in the log's order. Pure."""
    key_columns = keys.key_columns
    hidden = {*key_columns, VALUE, *METADATA_COLUMNS, DELETE_HORIZON_MS}
    payload = [f for f in log_schema if f.name not in hidden]
    return pa.schema(
        [*(log_schema.field(k) for k in key_columns), log_schema.field(VALUE), *payload]
    )


@dataclass(frozen=True)
class SegmentReader:
    """Reads a snapshot's segments on this process, a batch at a time, through pyarrow.

    Columns a file lacks are null and types are the log's (`ParquetReaderTask`);
    records below their partition's log start offset (``floors``) are dropped.
    """

    location: LogLocation
    floors: Mapping[int, int]

    def read(self, segment: DataFile, schema: pa.Schema) -> Iterator[pa.Table]:
        reader = ParquetReaderTask(table=self.location, schema=schema)
        for batch in reader(iter([pa.record_batch({_PATH: [segment.path]})])):
            records = pa.Table.from_batches([batch])
            if self.floors:
                records = at_or_above(records, self.floors)
            if records.num_rows:
                yield records

    def read_all(self, segments: Sequence[DataFile], schema: pa.Schema) -> pa.Table:
        tables = [t for s in segments for t in self.read(s, schema)]
        return pa.concat_tables(tables) if tables else schema.empty_table()


@dataclass(frozen=True)
class StatePlan:
    """What reading one snapshot's state needs: its sections and the tail's winners.

    ``winners`` holds (partition, offset) of each tail key's latest record;
    ``tail_keys`` the (partition, key columns) those winners belong to.
    """

    snapshot: LogSnapshot
    keys: LogKeys
    sections: LogSections
    reader: SegmentReader
    winners: pa.Table
    tail_keys: pa.Table

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> StatePlan:
        """Split ``snapshot`` into sections and find the tail's winners (reads narrow columns)."""
        keys = log_keys(snapshot, read_only=True)
        sections = log_sections(snapshot)
        snapshot.check_files([*sections.clean, *sections.dirty])
        starts = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
        reader = SegmentReader(snapshot.location, {p: s for p, s in starts.items() if s > 0})
        group = [PARTITION, *_own_keys(keys)]
        narrow = _subschema(snapshot.arrow_schema, [*group, *_order_columns(keys)])
        tail = reader.read_all(sections.dirty, narrow)
        if keys.sequence_column is not None and sections.clean and tail.num_rows:
            # A clean record may carry a higher sequence than the tail's: it competes too.
            tail_keys = tail.select(group).group_by(group).aggregate([])
            clean = reader.read_all(sections.clean, narrow)
            rivals = clean.take(_matching_rows(clean, tail_keys, group, "left semi"))
            tail = pa.concat_tables([tail, rivals])
        winners = arrow_latest_offsets(tail, keys.partitioned())
        return cls(
            snapshot,
            keys,
            sections,
            reader,
            winners.select([PARTITION, OFFSET]),
            winners.select(group),
        )

    @property
    def schema(self) -> pa.Schema:
        return state_schema(self.snapshot.arrow_schema, self.keys)

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Every live key's row once: the clean section filtered, then the tail's winners."""
        columns = _subschema(self.snapshot.arrow_schema, [*self.schema.names, PARTITION, OFFSET])
        for records in self.latest(columns):
            live = records.filter(pc.is_valid(records.column(VALUE)))
            yield from live.select(self.schema.names).cast(self.schema).to_batches(batch_rows)

    def latest(self, columns: pa.Schema) -> Iterator[pa.Table]:
        """Each (partition, key)'s latest record once, tombstones included, with ``columns``
        (which must hold ``partition``, ``offset`` and the key columns): what an export
        carries (`sinks.reading.arrow_export`)."""
        group = [PARTITION, *_own_keys(self.keys)]
        beaten = self.tail_keys.num_rows > 0
        with_sequence = self.keys.sequence_column is not None
        for segment in self.sections.clean:
            for records in self.reader.read(segment, columns):
                if beaten:
                    kept = _matching_rows(records, self.tail_keys, group, "left anti")
                    if with_sequence:
                        won = _matching_rows(
                            records, self.winners, [PARTITION, OFFSET], "left semi"
                        )
                        kept = np.union1d(kept, won)
                    records = records.take(kept)
                yield records
        for segment in self.sections.dirty:
            for records in self.reader.read(segment, columns):
                won = _matching_rows(records, self.winners, [PARTITION, OFFSET], "left semi")
                yield records.take(won)


def _matching_rows(
    records: pa.Table, other: pa.Table, on: Sequence[str], join_type: str
) -> np.ndarray:
    """Indices (ascending) of ``records``' rows that ``join_type`` keeps against ``other``.

    The join sees only the ``on`` columns: Arrow's hash join carries no nested
    non-key columns, and a value is often a struct.
    """
    narrow = records.select(list(on)).append_column(_ROW, pa.array(np.arange(records.num_rows)))
    kept = narrow.join(other.select(list(on)), list(on), join_type=join_type)
    return np.sort(kept.column(_ROW).to_numpy())


def _own_keys(keys: LogKeys) -> list[str]:
    return [k for k in keys.key_columns if k != PARTITION]


def _order_columns(keys: LogKeys) -> list[str]:
    sequence = keys.sequence_column
    extra = (
        [sequence] if sequence and sequence not in (*keys.key_columns, PARTITION, OFFSET) else []
    )
    return [*extra, OFFSET]


def _subschema(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in dict.fromkeys(names)])
