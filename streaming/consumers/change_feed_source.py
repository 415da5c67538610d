"""``readChangeFeed``: the log read as Delta's Change Data Feed, as a stream or over a range.

``spark.readStream.format("compacted-state").option("readChangeFeed", "true")`` and the
batch ``spark.read`` with ``startingVersion`` / ``endingVersion`` (or ``startingOffsets`` /
``endingOffsets``) give each change of a key's state with Delta's names (design.md §56,
`streaming.consumers.change_feed`). Before-images are read by time travel: the feed's
retention is the history window, ``file.delete.delay.ms`` (Delta's
``delta.deletedFileRetentionDuration``, 7 days by default); a read that needs an older
version is refused by name, `ChangeDataExpiredError` (design.md §57).

The stream's Spark offset is a Delta version, ``{"version": V}``: every change committed
at or before V has been read (Delta's CDF source offsets by version too). A micro-batch
reads whole appends, never part of one (``maxOffsetsPerTrigger`` does not apply). The
first batch of ``startingOffsets=earliest`` (the default) is the state at its end version
as ``insert`` rows, as Delta's CDF stream starts from a snapshot without
``startingVersion``; ``latest`` starts after the newest version; ``startingVersion`` at
that version's changes; a JSON map of offsets after the version that ends at them. A
registered consumer (``consumer.id``) commits, with each micro-batch, the log end offsets
of the version it read through, so `status` shows its lag as for any consumer, and a new
query with the same id resumes after that version.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import types as T

from sinks.errors import ConfigError
from sinks.log import (
    DELETE_HORIZON_MS,
    LogSnapshot,
    LogTable,
    log_arrow_schema,
    normalize_uri,
    read_commit,
)
from sinks.spark_compat import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from streaming.consumers.change_commits import AppendCommit, ChangeCommits
from streaming.consumers.change_feed import (
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    ChangeFeedPartition,
    ChangeFeedTask,
    PartitionAppend,
)
from streaming.consumers.consumer_position import Positions
from streaming.consumers.fetch_plan import files_by_partition
from streaming.consumers.source_options import SourceOptions

VERSION = "version"
NOTHING_READ = -1  # the offset before the first batch of ``earliest``: the state comes first
FROM_CREATION = -2  # before ``startingVersion=0``: every append from the log's creation


def change_feed_schema(path: str) -> T.StructType:
    """The feed's rows: the log's columns (without ``delete_horizon_ms``), then
    ``_change_type``, ``_commit_version``, ``_commit_timestamp``."""
    snapshot = LogTable(normalize_uri(path)).snapshot()
    if snapshot is None:
        raise ConfigError(f"format 'compacted-state': no log at {path} (nothing appended yet)")
    fields = [f for f in snapshot.spark_schema.fields if f.name != DELETE_HORIZON_MS]
    return T.StructType(
        [
            *fields,
            T.StructField("_change_type", T.StringType()),
            T.StructField(COMMIT_VERSION, T.LongType()),
            T.StructField(COMMIT_TIMESTAMP, T.TimestampType()),
        ]
    )


class _FeedReading:
    """What the stream and the batch reader share: the log, its appends, planning tasks."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.options = options
        self.log = LogTable(options.path)
        self.commits = ChangeCommits(self.log)
        record = T.StructType([f for f in schema.fields if not f.name.startswith("_")])
        self.task = ChangeFeedTask(options.path, log_arrow_schema(record))

    def snapshot(self) -> LogSnapshot:
        snapshot = self.log.snapshot()
        if snapshot is None:
            raise ConfigError(f"format 'compacted-state': no log at {self.options.path}")
        return snapshot

    def version_at(self, positions: Mapping[int, int]) -> int:
        """The version a reader at ``positions`` has read through."""
        snapshot = self.snapshot()
        return self.commits.version_at(positions, snapshot.version, snapshot.log_end_offsets())

    def plan(self, after: int, through: int) -> list[ChangeFeedPartition]:
        """The tasks of the changes committed in ``(after, through]``: per partition, its
        appends, and the before-images read at the version before its first one."""
        if after == NOTHING_READ:
            return self.plan_state(through)
        appends = self.commits.appends(after, through)
        by_partition: dict[int, list[PartitionAppend]] = {}
        for append in appends:
            for p, (first, until) in sorted(append.ranges.items()):
                by_partition.setdefault(p, []).append(
                    PartitionAppend(
                        append.version, append.timestamp_ms, append.paths[p], first, until
                    )
                )
        planned = []
        for p, runs in sorted(by_partition.items()):
            before = runs[0].version - 1
            self.commits.check_reachable(before)
            planned.append(ChangeFeedPartition(p, before, runs))
        return planned

    def plan_state(self, version: int) -> list[ChangeFeedPartition]:
        """The state at ``version`` as inserts: each partition's records there as one append
        over an empty state (Delta's CDF stream starts with its snapshot so)."""
        self.commits.check_reachable(version)
        snapshot = self.log.snapshot(version, verify=False)
        assert snapshot is not None
        stamp = _commit_ms(self.commits, version)
        planned = []
        for p, files in sorted(files_by_partition(snapshot).items()):
            start, end = snapshot.log_start_offset(p), snapshot.log_end_offset(p)
            if files and end > start:
                paths = tuple(dict.fromkeys(f.path for f in files))
                planned.append(
                    ChangeFeedPartition(p, -1, [PartitionAppend(version, stamp, paths, start, end)])
                )
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChangeFeedPartition):
            return iter(())  # Spark reads one empty partition when none was planned
        return self.task(partition)


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader of the feed: versions in, their changes out."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.reading = _FeedReading(options, schema)
        self.options = options
        self._available_now: int | None = None
        self._committed: tuple[int, float] | None = None
        self._initial: dict | None = None  # Spark may ask twice; the first answer holds

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.reading.snapshot().version

    def initialOffset(self) -> dict:
        """Where the feed starts: a registered consumer's committed offsets first, then
        ``startingVersion``, then ``startingOffsets``."""
        if self._initial is not None:
            return self._initial
        options, reading = self.options, self.reading
        version = NOTHING_READ
        committed: Positions = {}
        if options.consumer_id is not None:
            offsets = options.consumer_offsets()
            committed = offsets.committed(options.path, options.consumer_id)
        if committed:
            version = reading.version_at(committed)
        elif options.starting_version is not None:
            version = _after(options.starting_version - 1)
        elif options.starting_offsets == "latest":
            version = reading.snapshot().version
        elif isinstance(options.starting_offsets, Mapping):
            version = reading.version_at(options.starting_offsets)
        if options.consumer_id is not None:
            self._commit(version)  # registered from now on
        self._initial = {VERSION: version}
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self.options.consumer_id is not None:
            self._commit(int(start[VERSION]), only_if_stale=True)
        latest = self.reading.snapshot().version
        if self._available_now is not None:
            latest = min(latest, self._available_now)
        return {VERSION: max(latest, int(start[VERSION]))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.reading.plan(int(start[VERSION]), int(end[VERSION]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)

    def commit(self, end: dict) -> None:
        if self.options.consumer_id is not None:
            self._commit(int(end[VERSION]))

    def _commit(self, version: int, *, only_if_stale: bool = False) -> None:
        """Commit the log end offsets of ``version`` as the consumer's offsets."""
        assert self.options.consumer_id is not None
        now = time.monotonic()
        if only_if_stale and self._committed is not None:
            last, at = self._committed
            if last == version and now - at < self.options.consumer_expiration_ms / 4000:
                return
        self._committed = (version, now)
        snapshot = self.reading.snapshot()
        if version < 0:
            positions = {p: snapshot.log_start_offset(p) for p in snapshot.partitions}
        else:
            ends = snapshot.log_end_offsets()
            positions = self.reading.commits.ends_at(version, snapshot.version, ends)
        self.options.consumer_offsets().commit(
            self.options.path,
            self.options.consumer_id,
            positions,
            expiration_ms=self.options.consumer_expiration_ms,
            table_id=snapshot.table_id,
            table_version=snapshot.version,
        )


class ChangeFeedBatchReader(DataSourceReader):
    """``spark.read`` of the feed: the changes of ``startingVersion`` to ``endingVersion``
    (inclusive, as Delta's), or of the appends between ``startingOffsets`` and
    ``endingOffsets``."""

    def __init__(self, options: SourceOptions, schema: T.StructType) -> None:
        self.reading = _FeedReading(options, schema)
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options, reading = self.options, self.reading
        latest = reading.snapshot().version
        if options.starting_version is not None:
            after = options.starting_version - 1
        elif isinstance(options.starting_offsets, Mapping):
            after = reading.version_at(options.starting_offsets)
        else:
            raise ConfigError(
                "a batch read of the change feed needs option 'startingVersion' "
                "(or 'startingOffsets' as a JSON map), as Delta's does"
            )
        if options.ending_version is not None:
            through = options.ending_version
        elif isinstance(options.ending_offsets, Mapping):
            through = reading.version_at(options.ending_offsets)
        else:
            through = latest
        if through > latest:
            raise ConfigError(
                f"option 'endingVersion' {through} is past the log's newest version {latest}"
            )
        return reading.plan(_after(after), through)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)


def _after(version: int) -> int:
    """The offset before ``version + 1``'s changes: version -1 (``startingVersion=0``) is
    every append from the log's creation, not the state first."""
    return FROM_CREATION if version < 0 else version


def _commit_ms(commits: ChangeCommits, version: int) -> int:
    append: AppendCommit | None = commits.commit(version)
    if append is not None:
        return append.timestamp_ms
    actions = read_commit(commits.log.location, version) or []
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    return int(info.get("timestamp") or 0)
