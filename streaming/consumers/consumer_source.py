"""``spark.readStream.format("compacted-state")``: the log read as Kafka consumers read it.

A Python data source reader (no jars, on a classic or a Spark Connect session). Its
Spark offset is the reader's position per partition, ``{"0": 42, "1": 17}``
(`streaming.consumers.consumer_position`); a micro-batch reads the half-open ranges
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

This module holds the readers Spark calls; the driver plans a batch's files in
`streaming.consumers.fetch_plan` and each task reads them in `streaming.consumers.fetcher`.

Options (parsed by `streaming.consumers.source_options.SourceOptions`):

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

import pyarrow as pa
from pyspark.sql import types as T

from sinks.errors import ConfigError
from sinks.log import DELETE_HORIZON_MS, LogSnapshot, LogTable, log_arrow_schema, normalize_uri
from sinks.spark_compat import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from streaming.consumers.consumer_position import (
    Positions,
    fetch_ranges,
    from_offset,
    next_positions,
    starting_positions,
    to_offset,
)
from streaming.consumers.fetch_plan import (
    ConsumerReadPartition,
    files_by_partition,
    plan_partitions,
)
from streaming.consumers.fetcher import RangeReader, timestamp_positions
from streaming.consumers.source_options import SourceOptions

HEARTBEATS_PER_EXPIRATION = 4  # an idle, running consumer recommits this often per expiration


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


class ConsumerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader: positions in, one Delta version's records out per batch."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.reading = _LogReading(options, schema)
        self.options = options
        self._planned: dict[str, LogSnapshot] = {}  # end offset -> the snapshot that saw it
        self._committed: tuple[Positions, float] | None = None  # last commit, monotonic time
        self._available_now: Positions | None = None  # Trigger.AvailableNow's target
        self._initial: dict | None = None  # Spark may ask twice; the first answer holds

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the log end offsets of now, and no further.

        Spark then plans every batch through `latestOffset`, the last time from the end
        of the last batch, where a registered consumer commits what it has read: a
        consumer that read everything has nothing left (lag 0), as a Kafka consumer
        that committed after its last poll. (Without this, Spark fixes the target
        itself and never tells the source that the last batch was done.)
        """
        self._available_now = self.reading.snapshot().log_end_offsets()

    def initialOffset(self) -> dict:
        """The starting positions; a registered consumer's committed offsets come first.
        Asked again, the first answer: with ``latest`` the log may have moved since."""
        if self._initial is not None:
            return self._initial
        snapshot = self.reading.snapshot()
        positions = self.reading.starting_positions(snapshot)
        if self.options.consumer_id is not None:
            offsets = self.options.consumer_offsets()
            committed = offsets.committed(self.options.path, self.options.consumer_id)
            positions = {**positions, **committed}
            self._commit(positions)  # registered from now on: passes hold its deletes
        self._initial = to_offset(positions)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
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
        ends = bounds.ends
        if self._available_now is not None:
            target = self._available_now
            ends = {p: min(o, target[p]) for p, o in ends.items() if p in target}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = to_offset(
            next_positions(
                from_offset(start), ends, max_offsets=budget, log_start_offsets=bounds.starts
            )
        )
        self._planned = {_key(end): snapshot}
        return end

    def reportLatestOffset(self) -> dict | None:
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
        snapshot = self._planned.get(_key(to_offset(positions))) or self.log_snapshot_or_none()
        self.options.consumer_offsets().commit(
            self.options.path,
            self.options.consumer_id,
            positions,
            expiration_ms=self.options.consumer_expiration_ms,
            table_id=snapshot.table_id if snapshot is not None else None,
            table_version=snapshot.version if snapshot is not None else None,
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
