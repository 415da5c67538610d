"""The state without Spark: Kafka's "consume the compacted topic from the start", on Arrow.

A service rebuilding its cache, a notebook on a laptop, DuckDB or Polars read a
log's state with delta-rs and pyarrow alone, no JVM, resolved exactly as
`CompactedStateSink.state` resolves it (`sinks.reading.state_reader`):

    state = (clean ▷ keys(dirty)) ∪ latest(dirty), tombstones dropped

Which segments are clean is `log_sections`' answer for the snapshot (files another
engine wrote are always dirty),
the same function `state()` asks. First the *superseded* records are found from the
narrow columns alone (partition, key columns, the sequence column, offset) of the dirty
tail and of the clean records of the tail's keys (`sinks.reading.superseded`, design.md
§50); then every segment is read once, on every core, dropping the superseded records
and the tombstones. Records below a partition's log start offset
(``compacted-sink/log-start-offset/<p>``) are invisible, as in ``log()``.
The contenders are weighed a bucket of keys at a time when they would not fit
``log.cleaner.dedupe.buffer.size`` at once (`sinks.reading.superseded.weighing_buckets`),
so memory is bounded by that buffer, by the superseded offsets (eight bytes a record) and
by the row groups read ahead (one a thread), never by the clean section nor the tail, and
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

import pyarrow as pa

from sinks.config import CleanerConfig
from sinks.log.location import LogLocation
from sinks.log.log_keys import LogKeys, log_keys
from sinks.log.log_table import AsOf, LogSnapshot, LogTable
from sinks.log.ownership import check_new_log_location
from sinks.log.records import DELETE_HORIZON_MS, METADATA_COLUMNS, OFFSET, PARTITION, VALUE
from sinks.reading.segment_reader import (
    SegmentReader,
    SegmentRowGroup,
    ordered_map,
    reader_threads,
    row_groups,
)
from sinks.reading.state_reader import LogSections, log_sections
from sinks.reading.superseded import (
    Superseded,
    contenders_bound,
    rival_files,
    superseded,
    weighing_buckets,
)

DEFAULT_BATCH_ROWS = 65_536
DEFAULT_DEDUPE_BUFFER_SIZE = CleanerConfig().dedupe_buffer_size
"""``log.cleaner.dedupe.buffer.size``'s default: what weighing the contenders may hold."""


def read_state(
    path: str,
    as_of: AsOf | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
) -> pa.Table:
    """One row per live key of the log at ``path``: key columns, ``value``, payload columns.

    ``as_of`` (a Delta version, or a timestamp) reads the log as it was then, as
    ``state(as_of=...)`` does; outside the history window it raises the sink's
    time-travel error. ``storage_options`` use delta-rs's names. ``dedupe_buffer_size``
    (``log.cleaner.dedupe.buffer.size``, a process's setting as a pass's: default 512 MiB)
    bounds the memory the dirty tail's contenders are weighed in (`read_state_batches`).
    Raises `FileNotFoundError` when no log exists at ``path``. The whole state is built in
    memory; for larger states use `read_state_batches`. A live data file that is gone or
    truncated raises `MissingDataFileError` / `CorruptDataFileError` before any is read.
    """
    reader = read_state_batches(path, as_of, storage_options, dedupe_buffer_size=dedupe_buffer_size)
    return reader.read_all()


def read_state_batches(
    path: str,
    as_of: AsOf | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
) -> pa.RecordBatchReader:
    """`read_state`'s rows as a stream of record batches of at most ``batch_rows`` rows.

    The winners of the dirty tail are computed before the reader is returned (the
    snapshot is pinned then: later commits do not show), from the narrow columns, in as
    many buckets of keys as keep each bucket's contenders within ``dedupe_buffer_size``
    (each bucket reads the narrow columns again); segments are opened one at a time as
    the reader is consumed. A segment deleted meanwhile (outside the history window)
    fails the read with ``FileNotFoundError``.
    """
    log = LogTable(LogLocation.at(path, storage_options))
    snapshot = log.snapshot(as_of)
    if snapshot is None:
        check_new_log_location(log.location, read_only=True)  # someone else's files
        raise FileNotFoundError(f"no compacted log at {path}")
    plan = StatePlan.of(snapshot, dedupe_buffer_size=dedupe_buffer_size)
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
class StatePlan:
    """What reading one snapshot's state needs: its sections and the superseded records.

    ``superseded`` holds each partition's offsets of the records a newer record of their
    key supersedes (`sinks.reading.superseded`), found from the narrow columns before any
    payload is read.
    """

    snapshot: LogSnapshot
    keys: LogKeys
    sections: LogSections
    reader: SegmentReader
    superseded: Superseded
    threads: int

    @classmethod
    def of(
        cls,
        snapshot: LogSnapshot,
        threads: int | None = None,
        *,
        dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
    ) -> StatePlan:
        """Split ``snapshot`` into sections and find the superseded records (reads narrow
        columns, on ``threads`` threads: default one a core, in buckets of keys whose
        contenders fit ``dedupe_buffer_size``)."""
        keys = log_keys(snapshot, read_only=True)
        sections = log_sections(snapshot)
        snapshot.check_files([*sections.clean, *sections.dirty])
        reader = SegmentReader.of(snapshot)
        threads = threads or reader_threads()
        rivals = rival_files(sections.clean, sections.dirty)
        buckets = weighing_buckets(contenders_bound(rivals, sections.dirty), dedupe_buffer_size)
        found = superseded(snapshot, keys, rivals, sections.dirty, reader, threads, buckets)
        return cls(snapshot, keys, sections, reader, found, threads)

    @property
    def schema(self) -> pa.Schema:
        return state_schema(self.snapshot.arrow_schema, self.keys)

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Every live key's row once: the clean section filtered, then the tail's winners."""
        columns = _subschema(self.snapshot.arrow_schema, [*self.schema.names, PARTITION, OFFSET])
        names, schema = self.schema.names, self.schema
        for live in self.latest(columns, tombstones=False):
            yield from live.select(names).cast(schema).to_batches(batch_rows)

    def latest(self, columns: pa.Schema, *, tombstones: bool = True) -> Iterator[pa.Table]:
        """Each (partition, key)'s latest record once, tombstones included unless
        ``tombstones`` is False, with ``columns`` (which must hold ``partition``, ``offset``, the
        key columns, and ``value`` without tombstones): what an export carries
        (`sinks.reading.arrow_export`).
        Row groups are read on ``threads`` threads, at most that many ahead of the consumer
        (memory: that many row groups, whatever the segments' size), superseded records and
        tombstones dropped there; a superseded record's other columns are never decoded
        when its whole row group is superseded."""
        gone = self.superseded.offsets
        live = None if tombstones else VALUE

        def kept(unit: SegmentRowGroup) -> list[pa.Table]:
            tables = self.reader.read_kept(
                unit.segment, columns, gone, row_groups=[unit.index], live=live
            )
            return list(tables)

        segments = [*self.sections.clean, *self.sections.dirty]
        units = row_groups(self.reader, segments, self.threads)
        for tables in ordered_map(kept, units, self.threads):
            yield from tables


def _subschema(schema: pa.Schema, names: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in dict.fromkeys(names)])
