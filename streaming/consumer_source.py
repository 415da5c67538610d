"""``spark.readStream.format("compacted-state")``: the log read as Kafka consumers read it.

A Python data source reader (no jars, on a classic or a Spark Connect session). Its
Spark offset is the reader's position per partition, ``{"0": 42, "1": 17}``
(`streaming.consumer_position`); a micro-batch reads the half-open ranges
``[start[p], end[p])``. Rows carry the log's columns (key columns, ``value``,
``partition``, ``offset``, ``timestamp``, payload), in offset order per partition:
each Spark task reads one run of consecutive files of one partition. The cleaner's
internal ``delete_horizon_ms`` is left out (it is the cleaner's bookkeeping, not the
record's, and it changes when a pass stamps a tombstone).

Cleaning never disturbs a reader. Each micro-batch reads one Delta version: the
driver plans the batch's files from one snapshot (the one ``latestOffset`` saw,
when it is still at hand) and executors read exactly those files with pyarrow. A
pass that swaps them afterwards commits ``dataChange=false`` and its removed files
stay on storage for the history window (``delta.deletedFileRetentionDuration``),
so a planned read never loses a file. An offset a pass cleaned away is simply not
there: the read resumes at the next surviving offset. Deletion (retention,
``delete_records``) below a position is a loss, handled as ``failOnDataLoss`` says.

Options:

- ``startingOffsets``: ``earliest`` (default: the compacted log, then the tail, as
  Kafka Streams restores a table), ``latest``, or ``{"0": 42, "1": -2}``;
- ``startingTimestamp``: epoch ms; each partition starts at its first record at or
  after it (overrides ``startingOffsets``);
- ``endingOffsets`` (batch reads only): ``latest`` (default) or a JSON map;
- ``maxOffsetsPerTrigger``: offsets per micro-batch over all partitions;
- ``failOnDataLoss`` (default ``true``);
- ``consumer.id``: a registered consumer (see `checkpoints.consumer_offsets`); its
  offsets are committed when Spark commits a micro-batch, and a new query with the
  same id (a fresh checkpoint) starts from them, as a Kafka consumer group does;
- ``consumer.expiration.ms``: how long the consumer holds deletes without
  committing (default 7 days, Kafka's ``offsets.retention.minutes``);
- ``checkpoint_table``: the log's cleaner-offset checkpoint, when not the default
  ``_cleaner-offset-checkpoint`` beside the log (the consumer offsets live beside it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from checkpoints.consumer_offsets import (
    DEFAULT_CONSUMER_EXPIRATION_MS,
    ConsumerOffsets,
    consumer_offsets_uri,
)
from sinks.config import LONG_MAX
from sinks.errors import ConfigError
from sinks.log.file_reader import conform
from sinks.log.log_table import LogSnapshot, LogTable, log_arrow_schema
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, TIMESTAMP
from sinks.log.segment import Segment, is_segment_path
from sinks.log.storage import arrow_filesystem, normalize_uri, sibling
from streaming.consumer_position import (
    FetchRange,
    Positions,
    fetch_ranges,
    first_offsets_at,
    from_offset,
    next_positions,
    parse_starting_offsets,
    starting_positions,
    to_offset,
)

CHECKPOINT_TABLE_NAME = "_cleaner-offset-checkpoint"  # as `sinks.sink` places it
TASK_MAX_BYTES = 128 * 1024 * 1024  # files one task reads, as Spark's maxPartitionBytes
_BATCH_ROWS = 65_536
HEARTBEATS_PER_EXPIRATION = 4  # an idle, running consumer recommits this often per expiration


@dataclass(frozen=True)
class SourceOptions:
    """The reader's options, parsed on the driver; errors name the option."""

    path: str
    starting_offsets: str | Positions
    starting_timestamp_ms: int | None
    ending_offsets: str | Positions
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    consumer_id: str | None
    consumer_expiration_ms: int
    checkpoint_table: str

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        path = options.get("path")
        if not path:
            raise ConfigError("format 'compacted-state' needs a path: .load(path)")
        path = normalize_uri(path)
        ending = parse_starting_offsets(options.get("endingOffsets", "latest"))
        if ending == "earliest":
            raise ConfigError("option 'endingOffsets' must be latest or a JSON map")
        return cls(
            path=path,
            starting_offsets=parse_starting_offsets(options.get("startingOffsets", "earliest")),
            starting_timestamp_ms=_int(options, "startingTimestamp", minimum=0),
            ending_offsets=ending,
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", minimum=1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", default=True),
            consumer_id=options.get("consumer.id") or None,
            consumer_expiration_ms=_int(options, "consumer.expiration.ms", minimum=1)
            or DEFAULT_CONSUMER_EXPIRATION_MS,
            checkpoint_table=normalize_uri(
                options.get("checkpoint_table") or sibling(path, CHECKPOINT_TABLE_NAME)
            ),
        )

    def consumer_offsets(self) -> ConsumerOffsets:
        return ConsumerOffsets(consumer_offsets_uri(self.checkpoint_table))


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError as e:
        raise ConfigError(f"option {name!r} must be an integer; got {text!r}") from e
    if value < minimum:
        raise ConfigError(f"option {name!r} must be >= {minimum}; got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {name!r} must be true or false; got {text!r}")
    return text.strip().lower() == "true"


def source_schema(path: str) -> T.StructType:
    """The rows' schema: the log's columns without the cleaner's ``delete_horizon_ms``."""
    snapshot = LogTable(normalize_uri(path)).snapshot()
    if snapshot is None:
        raise ConfigError(f"format 'compacted-state': no log at {path} (nothing appended yet)")
    return T.StructType([f for f in snapshot.spark_schema.fields if f.name != DELETE_HORIZON_MS])


@dataclass(frozen=True)
class LogPositions:
    """A snapshot's log start and end offsets per partition."""

    starts: Positions
    ends: Positions

    @classmethod
    def of(cls, snapshot: LogSnapshot) -> LogPositions:
        return cls(
            starts={p: snapshot.log_start_offset(p) for p in snapshot.partitions},
            ends=snapshot.log_end_offsets(),
        )


class ConsumerReadPartition(InputPartition):
    """What one Spark task reads: consecutive files of one partition, one offset range."""

    def __init__(
        self, fetch: FetchRange, paths: Sequence[str], whole: Sequence[bool], ordered: bool
    ) -> None:
        super().__init__((fetch.partition, fetch.from_offset, fetch.until_offset))
        self.fetch = fetch
        self.paths = tuple(paths)
        self.whole = tuple(whole)  # per file: every offset of it lies in the range
        self.ordered = ordered  # the files' offset ranges follow one another


def plan_partitions(
    segments: Mapping[int, Sequence[Segment]],
    ranges: Sequence[FetchRange],
    *,
    max_bytes: int = TASK_MAX_BYTES,
) -> list[ConsumerReadPartition]:
    """One read partition per run of a partition's files overlapping its range. Pure.

    A run is cut at ``max_bytes`` only between files whose offsets do not overlap,
    so offset order within a partition is the order of its read partitions.
    """
    planned: list[ConsumerReadPartition] = []
    for fetch in ranges:
        chosen = [
            s
            for s in sorted(segments.get(fetch.partition, []))
            if s.last_offset >= fetch.from_offset and s.base_offset < fetch.until_offset
        ]
        run: list[Segment] = []
        run_bytes = 0
        for segment in chosen:
            run_end = max((s.last_offset for s in run), default=-1)
            if run and run_bytes >= max_bytes and segment.base_offset > run_end:
                planned.append(_read_partition(fetch, run))
                run, run_bytes = [], 0
            run.append(segment)
            run_bytes += segment.size_bytes
        if run:
            planned.append(_read_partition(fetch, run))
    return planned


def files_by_partition(snapshot: LogSnapshot) -> dict[int, list[Segment]]:
    """Each partition's segments, plus every file another engine wrote that may hold its
    records (`sinks.log.segment.ForeignFile`), as a segment spanning every offset: its
    records are then filtered to the range and sorted by offset (`RangeReader`)."""
    files = {p: list(segments) for p, segments in snapshot.segments.items()}
    for foreign in snapshot.foreign_files:
        for p in snapshot.partitions:
            if foreign.may_hold(p):
                files.setdefault(p, []).append(
                    Segment(p, 0, LONG_MAX, foreign.path, foreign.size_bytes, foreign.num_records)
                )
    return files


def _read_partition(fetch: FetchRange, run: Sequence[Segment]) -> ConsumerReadPartition:
    low = max(fetch.from_offset, run[0].base_offset)
    high = min(fetch.until_offset, max(s.last_offset for s in run) + 1)
    return ConsumerReadPartition(
        FetchRange(fetch.partition, low, high),
        [s.path for s in run],
        [low <= s.base_offset and s.last_offset < high for s in run],
        # Only the sink's own files are sorted by offset; another engine's may be in any order.
        all(is_segment_path(s.path) for s in run)
        and all(a.last_offset < b.base_offset for a, b in zip(run, run[1:], strict=False)),
    )


@dataclass(frozen=True)
class RangeReader:
    """The picklable reading each Spark task runs: one partition's files, one offset range."""

    table_uri: str
    schema: pa.Schema

    def __call__(self, partition: ConsumerReadPartition) -> Iterator[pa.RecordBatch]:
        """The range's records in offset order: files whose offsets follow one another
        stream batch by batch (a file wholly inside the range unfiltered by offset);
        overlapping files (rewritten by another engine) are read whole and sorted."""
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


class _LogReading:
    """What the stream and the batch reader share: the log, its schema, planning a range."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        self.log = LogTable(options.path)
        self.read_range = RangeReader(options.path, log_arrow_schema(schema))

    def snapshot(self) -> LogSnapshot:
        snapshot = self.log.snapshot()
        if snapshot is None:
            raise ConfigError(f"format 'compacted-state': no log at {self.options.path}")
        return snapshot

    def starting_positions(self, snapshot: LogSnapshot) -> Positions:
        bounds = LogPositions.of(snapshot)
        if self.options.starting_timestamp_ms is not None:
            return timestamp_positions(snapshot, self.options.starting_timestamp_ms)
        return starting_positions(
            self.options.starting_offsets,
            log_start_offsets=bounds.starts,
            log_end_offsets=bounds.ends,
        )

    def plan(
        self, snapshot: LogSnapshot, start: Positions, end: Positions
    ) -> list[ConsumerReadPartition]:
        ranges = fetch_ranges(
            start,
            end,
            LogPositions.of(snapshot).starts,
            fail_on_data_loss=self.options.fail_on_data_loss,
            log_path=self.options.path,
        )
        return plan_partitions(files_by_partition(snapshot), ranges)


class ConsumerStreamReader(DataSourceStreamReader):
    """The micro-batch reader: positions in, one Delta version's records out per batch."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.reading = _LogReading(options, schema)
        self.options = options
        self._planned: dict[str, LogSnapshot] = {}  # end offset -> the snapshot that saw it
        self._committed: tuple[Positions, float] | None = None  # last commit, monotonic time

    def initialOffset(self) -> dict:  # noqa: N802
        """The starting positions; a registered consumer's committed offsets come first."""
        snapshot = self.reading.snapshot()
        positions = self.reading.starting_positions(snapshot)
        if self.options.consumer_id is not None:
            offsets = self.options.consumer_offsets()
            committed = offsets.committed(self.options.path, self.options.consumer_id)
            positions = {**positions, **committed}
            self._commit(positions)  # registered from now on: passes hold its deletes
        return to_offset(positions)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """The end of the next micro-batch.

        Spark asks from the end of its last committed batch, so a registered consumer
        commits ``start`` here too (when it moved, or as a heartbeat): Spark calls
        ``commit(end)`` only when it plans the batch after, and a consumer that stops
        after its last batch must not hold what it has read.
        """
        if self.options.consumer_id is not None:
            self._commit(from_offset(start), only_if_stale=True)
        snapshot = self.reading.snapshot()
        bounds = LogPositions.of(snapshot)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = to_offset(
            next_positions(
                from_offset(start), bounds.ends, max_offsets=budget, log_start_offsets=bounds.starts
            )
        )
        self._planned = {_key(end): snapshot}
        return end

    def reportLatestOffset(self) -> dict | None:  # noqa: N802
        snapshot = self.log_snapshot_or_none()
        return None if snapshot is None else to_offset(snapshot.log_end_offsets())

    def log_snapshot_or_none(self) -> LogSnapshot | None:
        return self.reading.log.snapshot()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        snapshot = self._planned.get(_key(end)) or self.reading.snapshot()
        return self.reading.plan(snapshot, from_offset(start), from_offset(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ConsumerReadPartition):
            return iter(())  # Spark reads one empty partition when none was planned
        return self.reading.read_range(partition)

    def commit(self, end: dict) -> None:
        """Spark committed the micro-batch that ends at ``end``: a registered consumer's
        committed offsets move there (idempotent)."""
        if self.options.consumer_id is not None:
            self._commit(from_offset(end))

    def _commit(self, positions: Positions, *, only_if_stale: bool = False) -> None:
        assert self.options.consumer_id is not None
        now = time.monotonic()
        if only_if_stale and self._committed is not None:
            last, at = self._committed
            heartbeat_s = self.options.consumer_expiration_ms / 1000 / HEARTBEATS_PER_EXPIRATION
            if last == positions and now - at < heartbeat_s:
                return
        self._committed = (dict(positions), now)
        self.options.consumer_offsets().commit(
            self.options.path,
            self.options.consumer_id,
            positions,
            expiration_ms=self.options.consumer_expiration_ms,
        )


class ConsumerBatchReader(DataSourceReader):
    """``spark.read.format("compacted-state")``: the records between starting and ending
    offsets, at the current version."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.reading = _LogReading(options, schema)
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        snapshot = self.reading.snapshot()
        bounds = LogPositions.of(snapshot)
        start = self.reading.starting_positions(snapshot)
        end = starting_positions(
            self.options.ending_offsets,
            log_start_offsets=bounds.starts,
            log_end_offsets=bounds.ends,
        )
        end = {p: min(o, bounds.ends.get(p, o)) for p, o in end.items()}
        end = {p: o for p, o in end.items() if p in start}
        return self.reading.plan(snapshot, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ConsumerReadPartition):
            return iter(())  # Spark reads one empty partition when none was planned
        return self.reading.read_range(partition)


def _key(offset: Mapping[str, int]) -> str:
    return json.dumps(dict(offset), sort_keys=True)
