"""Kafka's `Cleaner`: one pass over a log, top to bottom, planned on the driver, run as
per-partition Spark tasks, committed once.

Invariant (Kafka's): *a record with key K and offset O is obsolete if there is
a record with key K and offset O' > O* (with a ``sequence_column``: a higher
(sequence, offset)); the rules live once, in `sinks.cleaner.rules`.

A pass reads in this file in the order it runs, as Kafka's ``LogCleaner.scala`` does
(doWork → grabFilthiestCompactedLog → doClean → buildOffsetMap → cleanSegments →
replaceSegments → doneCleaning):

1. `Cleaner.clean`: the pass, planned again from the new version when another writer
   committed the same files first (at most ``PASS_ATTEMPTS`` times), then throttled
   (`sinks.cleaner.throttler`);
2. `Cleaner.clean_log`: files another engine wrote are rewritten into segments first
   (`Cleaner.absorb_foreign_files`: a pass plans over segments only); the filthiest
   cleanable partitions are chosen and claimed
   (`sinks.cleaner.cleaner_manager.grab_filthiest_compacted_log`) from the plan the
   round was given (`CleaningPlan`, measured once: planned again only when the log
   moved or its checkpoint rows were not read fresh);
3. `Cleaner.do_clean`: each chosen partition's share (`Cleaner.plan`: which files, where
   its offset map ends), the inputs checked, the Spark job (`clean_segments`), the
   pass's figures (`CleanerStats`);
4. in each task (`RecopyTask`): the partition's offset map
   (`RecopyTask.build_offset_map`, `sinks.cleaner.offset_map`), then each group of
   files recopied (`RecopyTask.retained`);
5. `Cleaner.replace_segments`: the old files swapped for the new in one Delta commit
   with ``dataChange=false``;
6. `CleanerManager.checkpoint_pass` (Kafka's ``doneCleaning``): the partitions' first
   dirty offsets and states, in the checkpoint table.

A pass over a log reads every segment below each chosen partition's end offset,
keeps the latest record per key, stamps or drops tombstones by the delete-horizon
rule (KIP-534), writes the survivors grouped into files of at most ``segment.bytes``,
and swaps the old files for the new in one Delta commit. Offsets are never rewritten.

As Kafka's cleaner threads each clean one log at a time, each Spark task cleans one
partition: it builds the partition's offset map where it runs and recopies its files.
The driver plans from the Delta log alone (which files, in which groups, where each
partition's pass ends so its map fits ``log.cleaner.dedupe.buffer.size``) and commits;
it never holds a key. One algorithm for every key type and for a sequence column:
there is no other path.

The tasks (`clean_segments`): each Spark task is one of Kafka's cleaner threads: it
cleans the partitions given to it (`packed`: one task per core, balanced by bytes) one
after another, and for each it reads the narrow columns (keys, offset, sequence) of
the partition's mapped files with pyarrow, builds the exact map where it runs, then
reads, filters and writes each group of files, one row group at a time, with pyarrow:
a record with key K and offset O is kept unless the map holds an offset O' > O for K;
tombstones then follow KIP-534 (`sinks.cleaner.rules.apply_arrow_tombstone_rules`).
The driver only ships file names: no key ever leaves a task, no Spark row carries a
value, nothing is shuffled, and each input byte is read once (plus the narrow columns
of the mapped files once, or once per hash bucket of keys when the map is built in
buckets). A task's memory is one map, bounded by ``log.cleaner.dedupe.buffer.size``
through the records the driver lets it map at once
(`sinks.cleaner.offset_map.size_map`), plus the row group it is recopying. Writing is
not idempotent: every task writes new files, which only the pass's commit makes part
of the log (a crash leaves orphans for recovery; the old files or the new ones are
live, never both).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks.cleaner.cleaner_manager import (
    CleanerManager,
    CleaningPlan,
    LogPlanner,
    grab_filthiest_compacted_log,
    held_tombstones,
)
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.log_to_clean import LogToClean, group_segments_by_size, segments_to_clean
from sinks.cleaner.offset_map import OffsetMap, canonical_keys, key_buckets, size_map
from sinks.cleaner.rules import apply_arrow_tombstone_rules, spark_latest_offsets
from sinks.cleaner.throttler import Throttler, at_lower_priority
from sinks.config import LONG_MAX, CleanerConfig
from sinks.crash_points import CLEAN_BEFORE_CHECKPOINT, CLEAN_BEFORE_COMMIT, crash_point
from sinks.errors import CleanerError, ConcurrentCommitError, TableFeatureError
from sinks.log.file_reader import conform
from sinks.log.foreign.rearrangement import absorb
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import CLEANER_OFFSET_TXN, LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment import Segment
from sinks.log.segment_writer import (
    WRITTEN_SEGMENT_DDL,
    SegmentWriterTask,
    WrittenSegment,
    nullable_schema,
    stats_columns,
)
from sinks.log.storage import arrow_filesystem, delete_files, normalize_uri
from sinks.spark_session import default_parallelism

logger = logging.getLogger("compacted_sink")

PASS_ATTEMPTS = 3
"""How many times `Cleaner.clean` plans a pass whose commit another writer's beat."""

_BIN = "bin"


class Cleaner:
    """Runs passes over one log; holds no state between passes but its throttler's.

    ``manager`` claims and checkpoints the partitions, ``planner`` measures them
    (`CleaningPlan`); ``config`` gives ``delete.retention.ms``, ``segment.bytes``,
    ``log.cleaner.dedupe.buffer.size`` (each task's offset map) and the throttler's rate.
    """

    def __init__(
        self,
        log: LogTable,
        manager: CleanerManager,
        planner: LogPlanner,
        config: CleanerConfig,
        *,
        keys: LogKeys,
        clock: Callable[[], int],
    ) -> None:
        self.log = log
        self.manager = manager
        self.planner = planner
        self.config = config
        self.clock = clock
        self.keys = keys
        self.delete_retention_ms = config.delete_retention_ms
        self.segment_bytes = config.segment_bytes
        self.dedupe_buffer_size = config.dedupe_buffer_size
        self.throttler = Throttler(config.log_cleaner_io_max_bytes_per_second)

    # -- 1. the pass ----------------------------------------------------------------------

    def clean(
        self,
        spark: SparkSession,
        *,
        force: bool = False,
        snapshot: LogSnapshot | None = None,
        plan: CleaningPlan | None = None,
        max_tasks: int | None = None,
        niceness: int = 0,
    ) -> CleanerStats | None:
        """One pass over every cleanable partition now, dirtiest first; None when none is.

        ``plan``: the round's measure of the log (`LogPlanner.plan`), used when it is of
        the version the pass starts from and its checkpoint rows were read fresh;
        otherwise the pass measures its version itself. The pass runs at most
        ``max_tasks`` Spark tasks at once (None: every core), each niced by ``niceness``
        (`sinks.cleaner.throttler.at_lower_priority`).

        Without ``force`` a partition qualifies by design.md §4 (ratio, max lag, or an
        expired tombstone); with it, any cleanable bytes or expired tombstone will do.
        Raises `CleanerError` when the pass fails; the log is then unchanged.
        """
        stats = None
        for attempt in range(PASS_ATTEMPTS):
            snapshot = snapshot if attempt == 0 and snapshot else self.log.snapshot()
            if snapshot is None:
                return None
            try:
                stats = self.clean_log(
                    spark,
                    snapshot,
                    plan if attempt == 0 else None,
                    force=force,
                    max_tasks=max_tasks,
                    niceness=niceness,
                )
                break
            except CleanerError as e:
                # Another writer swapped the same files first (another cleaner, an
                # OPTIMIZE): nothing was committed; plan again from the new version.
                conflicted = isinstance(e.__cause__, ConcurrentCommitError)
                if attempt + 1 == PASS_ATTEMPTS or not conflicted:
                    raise
                logger.info("pass over %s conflicted; planning again: %s", self.log.uri, e)
        if stats is not None:
            slept = self.throttler.maybe_throttle(stats.bytes_read + stats.bytes_written)
            if slept:
                stats = replace(stats, throttled_ms=int(slept * 1000))
        return stats

    # -- 2. choose and claim, clean, checkpoint -------------------------------------------

    def clean_log(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        plan: CleaningPlan | None,
        *,
        force: bool,
        max_tasks: int | None,
        niceness: int,
    ) -> CleanerStats | None:
        """Choose, claim, run the pass, checkpoint: Kafka's ``grabFilthiestCompactedLog``
        + ``cleanLog`` + ``doneCleaning`` for one log.

        Files another engine wrote are rewritten into segments first
        (`absorb_foreign_files`): a pass plans over segments only.
        """
        if snapshot.foreign_files:
            absorbed = self.absorb_foreign_files(spark, snapshot)
            if absorbed is None:
                return None
            snapshot = absorbed
        start = self.clock()
        claim = grab_filthiest_compacted_log(
            self.log,
            self.planner,
            self.manager,
            self.config,
            snapshot,
            plan=plan,
            now_ms=start,
            force=force,
        )
        if claim is None:
            return None
        try:
            with self.manager.heartbeating(claim.partitions):
                stats = self.do_clean(
                    spark,
                    claim.snapshot,
                    claim.logs,
                    pass_start_ms=start,
                    max_tasks=max_tasks,
                    niceness=niceness,
                    held_below=self.planner.consumer_holds(claim.snapshot, now_ms=start),
                )
        except ConcurrentCommitError as e:
            self.manager.abort_cleaning(claim.partitions)
            raise CleanerError(
                f"another cleaner committed first ({e}); this pass was dropped",
                log_path=self.log.uri,
                partition=claim.logs[0].partition,
            ) from e
        except TableFeatureError:
            # Not this partition's failure: no commit to the log can succeed until the
            # feature goes, and the error says how.
            self.manager.abort_cleaning(claim.partitions)
            raise
        except Exception as e:
            self.manager.mark_uncleanable(claim.partitions, e)
            raise CleanerError(
                f"pass failed ({type(e).__name__}: {str(e)[:500]}); marked uncleanable, "
                "retried with backoff",
                log_path=self.log.uri,
                partition=claim.logs[0].partition,
            ) from e
        budget = self.config.log_cleaner_max_bytes_per_pass
        if budget < LONG_MAX:
            work_left = claim.work_left or stats.work_left
            stats = replace(stats, budget_bytes=budget, work_left=work_left)
        crash_point(CLEAN_BEFORE_CHECKPOINT)
        self.manager.checkpoint_pass(claim.logs, stats, table_id=claim.snapshot.table_id)
        logger.info("%s", stats.summary())
        return stats

    def absorb_foreign_files(
        self, spark: SparkSession, snapshot: LogSnapshot
    ) -> LogSnapshot | None:
        """Rewrite another engine's files into segments (`sinks.log.foreign.rearrangement`,
        design.md §14), holding every partition of the log; None when some partition is
        busy elsewhere.

        Another engine's OPTIMIZE, Z-order or auto compaction leaves files that are not
        one partition's offset-ordered run. Every partition is held, because a foreign
        file may hold any of them, and a pass over a partition must not run while its
        records sit outside its segments.
        """
        partitions = snapshot.partitions
        claimed = set(self.manager.start_cleaning(partitions))
        if claimed != set(partitions):
            self.manager.abort_cleaning(claimed)
            logger.info("files another engine wrote in %s wait: partitions busy", self.log.uri)
            return None
        try:
            with self.manager.heartbeating(claimed):
                fresh = self.log.snapshot() or snapshot
                report = absorb(
                    spark,
                    self.log,
                    fresh,
                    stats_columns=self.stats_columns(fresh),
                    segment_bytes=self.segment_bytes,
                    keys=self.keys,
                    latest_offsets=spark_latest_offsets,
                )
        except ConcurrentCommitError as e:
            raise CleanerError(
                f"another writer rewrote the same files first ({e}); tried again next round",
                log_path=self.log.uri,
                partition=partitions[0],
            ) from e
        finally:
            self.manager.abort_cleaning(claimed)
        if report is not None:
            logger.info("cleaner: %s: %s", self.log.uri, report.summary())
        return self.log.snapshot()

    # -- 3. the chosen partitions' pass --------------------------------------------------

    def do_clean(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        logs: Sequence[LogToClean],
        *,
        pass_start_ms: int,
        max_tasks: int | None = None,
        niceness: int = 0,
        held_below: Mapping[int, int] | None = None,
    ) -> CleanerStats:
        """One pass over the given partitions, committed atomically against ``snapshot``.

        Each partition's pass ends at its first uncleanable offset, or earlier where its
        offset map fills (``work_left`` is then True and the rest waits for the next pass).
        ``max_tasks`` caps how many Spark tasks the pass runs at once (a background pass
        leaves the other cores to the query); None: every core. Each task runs on a thread
        niced by ``niceness``. ``held_below`` keeps expired tombstones registered consumers
        have not read (`sinks.cleaner.cleaner_manager.consumer_holds`).

        Raises `ConcurrentCommitError` when another cleaner swapped the
        same files first; the files this pass wrote are then orphans for recovery.
        A crash anywhere leaves either the old files or the new ones live, never both.
        """
        started = time.monotonic()
        if snapshot.foreign_files:
            raise ValueError("a pass plans over segments: rewrite the foreign files first")
        plans = self.plan(snapshot, logs)
        # A lost or truncated input fails the pass by name, before anything is written.
        snapshot.check_files([s for plan in plans for s in plan.inputs])
        written = self.recopy(
            spark,
            snapshot,
            plans,
            pass_start_ms=pass_start_ms,
            max_tasks=max_tasks,
            niceness=niceness,
            held_below=held_below,
        )
        inputs = [s for plan in plans for s in plan.inputs]
        end_offsets = {plan.partition: plan.end_offset for plan in plans}
        stats = CleanerStats(
            log_path=self.log.uri,
            start_ms=pass_start_ms,
            duration_ms=0,
            end_offsets=end_offsets,
            first_dirty_offsets={log.partition: log.first_dirty_offset for log in logs},
            segments_read=len(inputs),
            segments_written=len(written),
            bytes_read=sum(s.size_bytes for s in inputs),
            bytes_written=sum(w.size_bytes for w in written),
            records_read=sum(s.num_records for s in inputs),
            records_written=sum(w.num_records for w in written),
            work_left=any(plan.cut for plan in plans),
            tombstones_held=held_tombstones(self.log.location, written, pass_start_ms=pass_start_ms)
            if held_below
            else 0,
        )
        crash_point(CLEAN_BEFORE_COMMIT)
        self.replace_segments(snapshot, written, inputs, stats)
        duration = int((time.monotonic() - started) * 1000)
        # The planned-from snapshot stays a value; the version after the pass comes
        # from a fresh read (at or after the pass's own commit when others appended).
        after = self.log.snapshot()
        return replace(stats, duration_ms=duration, delta_version=after.version if after else None)

    def plan(self, snapshot: LogSnapshot, logs: Sequence[LogToClean]) -> list[PartitionPlan]:
        """Each chosen partition's share of the next pass, from the Delta log only. Pure."""
        return [
            plan_partition(
                log,
                snapshot.segments.get(log.partition, []),
                cleaner_offset=snapshot.cleaner_offset(log.partition),
                keys=self.keys,
                dedupe_buffer_size=self.dedupe_buffer_size,
            )
            for log in logs
        ]

    def recopy(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        plans: Sequence[PartitionPlan],
        *,
        pass_start_ms: int,
        max_tasks: int | None,
        niceness: int,
        held_below: Mapping[int, int] | None,
    ) -> list[WrittenSegment]:
        """Run the planned partitions' tasks; the files they wrote (none for an empty plan)."""
        # A partition is one task's work (`partitions_to_clean`), so its groups only size
        # its output files: segment.bytes each, as Kafka groups segments.
        slots = min(default_parallelism(spark), max_tasks or LONG_MAX)
        groups = {
            plan.partition: group_segments_by_size(plan.inputs, self.segment_bytes)
            for plan in plans
            if plan.inputs
        }
        if not groups:
            return []
        tasks = partitions_to_clean(
            {plan.partition: plan.mapped for plan in plans},
            groups,
            buckets={plan.partition: plan.buckets for plan in plans},
        )
        return clean_segments(
            spark,
            tasks,
            snapshot=snapshot,
            keys=self.keys,
            pass_start_ms=pass_start_ms,
            delete_retention_ms=self.delete_retention_ms,
            stats_columns=self.stats_columns(snapshot),
            max_file_bytes=self.segment_bytes,
            slots=slots,
            niceness=niceness,
            held_below=held_below,
        )

    def replace_segments(
        self,
        snapshot: LogSnapshot,
        written: Sequence[WrittenSegment],
        inputs: Sequence[Segment],
        stats: CleanerStats,
    ) -> None:
        """Kafka's ``replaceSegments``: swap ``inputs`` for ``written`` in one commit
        against ``snapshot``, recording each partition's new cleaner offset; on a conflict
        the written files are deleted."""
        end_offsets = stats.end_offsets
        try:
            snapshot.commit(
                adds=written,
                removes=inputs,
                data_change=False,
                transactions={CLEANER_OFFSET_TXN.format(p): e for p, e in end_offsets.items()},
                info={
                    "operation": "clean",
                    "passStartMs": stats.start_ms,
                    "endOffsets": {str(p): e for p, e in end_offsets.items()},
                    "recordsRead": stats.records_read,
                    "recordsWritten": stats.records_written,
                    "bytesRead": stats.bytes_read,
                    "bytesWritten": stats.bytes_written,
                },
            )
        except ConcurrentCommitError:
            # Nothing was committed: the files this pass wrote are garbage now.
            delete_files(self.log.uri, [w.path for w in written], self.log.storage_options)
            raise

    def stats_columns(self, snapshot: LogSnapshot) -> list[str]:
        """The columns whose statistics each file this log's passes write carries."""
        return stats_columns(snapshot.spark_schema, self.keys)


# -- the plan of one partition's share, pure --


@dataclass(frozen=True)
class PartitionPlan:
    """One partition's share of a pass: the files it reads, those its map covers (built in
    ``buckets``), where it ends (``end_offset``, the next first dirty offset) and whether
    the map cut it short.
    """

    partition: int
    inputs: tuple[Segment, ...]
    mapped: tuple[Segment, ...]
    end_offset: int
    cut: bool
    buckets: int = 1


def plan_partition(
    log: LogToClean,
    segments: Sequence[Segment],
    *,
    cleaner_offset: int | None,
    keys: LogKeys,
    dedupe_buffer_size: int,
) -> PartitionPlan:
    """Which files a partition's pass reads and maps, and how, within the dedupe buffer. Pure.

    The end is the first uncleanable offset, or lower, at a segment boundary, when not
    even a map built in buckets fits (`sinks.cleaner.offset_map.size_map`).
    """
    inputs = segments_to_clean(segments, log.first_uncleanable_offset)
    size = size_map(
        inputs,
        first_dirty_offset=log.first_dirty_offset,
        cleaner_offset=cleaner_offset,
        keys=keys,
        end_offset=log.first_uncleanable_offset,
        dedupe_buffer_size=dedupe_buffer_size,
    )
    return PartitionPlan(
        partition=log.partition,
        inputs=tuple(s for s in inputs if s.last_offset < size.end_offset),
        mapped=size.mapped,
        end_offset=size.end_offset,
        cut=size.end_offset < log.first_uncleanable_offset,
        buckets=size.buckets,
    )


# -- 4. the tasks: build each partition's offset map, recopy its groups --


@dataclass(frozen=True)
class PartitionToClean:
    """What one task cleans: one partition's groups of files, and the files its map covers.

    ``mapped`` are the paths whose records the map is built from, in ``buckets`` scans
    (`sinks.cleaner.offset_map.size_map`); each group (consecutive files, one output
    file each) is recopied in turn.
    """

    partition: int
    mapped: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    size_bytes: int = 0
    buckets: int = 1

    @property
    def probes_keys(self) -> bool:
        """Whether a clean file is recopied by key (its records are not mapped)."""
        mapped = set(self.mapped)
        return any(path not in mapped for group in self.groups for path in group)


def partitions_to_clean(
    mapped: Mapping[int, Sequence[Segment]],
    groups: Mapping[int, Sequence[Sequence[Segment]]],
    buckets: Mapping[int, int] | None = None,
) -> list[PartitionToClean]:
    """The pass's work: each partition whole, its map built once, largest first. Pure.

    A partition is never split over tasks: measured on 2 cores (one partition of 3 M
    records, best of two), two tasks that each map the partition took 4.21 s against
    2.65 s for one task; the second map costs more than the second core gains.
    """
    tasks = [
        PartitionToClean(
            partition,
            tuple(s.path for s in mapped.get(partition, [])),
            tuple(tuple(s.path for s in g) for g in runs),
            sum(s.size_bytes for g in runs for s in g),
            (buckets or {}).get(partition, 1),
        )
        for partition, runs in groups.items()
    ]
    return sorted(tasks, key=lambda t: -t.size_bytes)


def packed(tasks: Sequence[PartitionToClean], slots: int) -> list[list[int]]:
    """``tasks``' indexes in at most ``slots`` bins of about equal bytes, largest first. Pure.

    Each bin is one Spark task that cleans its partitions one after another, as Kafka's
    cleaner thread cleans one log after another: a pass over many small partitions pays
    a Spark task's fixed cost once per core, not once per partition.
    """
    bins: list[list[int]] = [[] for _ in range(max(1, min(slots, len(tasks))))]
    loads = [0] * len(bins)
    for index in sorted(range(len(tasks)), key=lambda i: -tasks[i].size_bytes):
        lightest = loads.index(min(loads))
        bins[lightest].append(index)
        loads[lightest] += tasks[index].size_bytes
    return bins


@dataclass(frozen=True)
class RecopyTask:
    """The picklable function each Spark task runs: bin indexes in (`packed`), written
    segments out."""

    table_uri: str
    storage_options: dict[str, str]
    schema: pa.Schema
    key_columns: tuple[str, ...]
    sequence_column: str | None
    tasks: tuple[PartitionToClean, ...]
    bins: tuple[tuple[int, ...], ...]
    log_start_offsets: dict[int, int]
    pass_start_ms: int
    delete_retention_ms: int
    stats_columns: tuple[str, ...]
    max_file_bytes: int
    niceness: int = 0
    held_below: dict[int, int] = field(default_factory=dict)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = SegmentWriterTask(
            table_uri=self.table_uri,
            schema=self.schema,
            stats_columns=self.stats_columns,
            max_file_bytes=self.max_file_bytes,
            group_column=None,
            storage_options=self.storage_options,
            key_columns=self.key_columns,
        )
        indexes = self.indexes(batches)

        def clean() -> Iterator[pa.RecordBatch]:
            for index in indexes:
                task = self.tasks[index]
                offset_map = self.build_offset_map(task)
                mapped = set(task.mapped)
                for group in task.groups:
                    yield from writer(self.retained(task.partition, group, offset_map, mapped))

        yield from at_lower_priority(self.niceness, clean)

    def indexes(self, batches: Iterator[pa.RecordBatch]) -> list[int]:
        """The partitions (indexes into ``tasks``) of the bins this Spark task was given."""
        return [
            task
            for batch in batches
            for b in batch.column(_BIN).to_pylist()
            for task in self.bins[int(b)]
        ]

    def newest(self, task: PartitionToClean) -> Iterator[pa.Table]:
        """Each key's newest record of the partition, tombstones included, read file by
        file and not written: what a pass would keep before the tombstone rules."""
        offset_map = self.build_offset_map(task)
        mapped = set(task.mapped)
        for group in task.groups:
            yield from self.survivors(task.partition, group, offset_map, mapped)

    def survivors(
        self, partition: int, paths: Sequence[str], offset_map: OffsetMap, mapped: set[str]
    ) -> Iterator[pa.Table]:
        """The records of ``paths`` that are their key's newest, file by file, row group by
        row group, in offset order.

        A mapped file keeps the records that are their key's newest; a clean file (only
        without a sequence column) keeps those whose key the map does not hold.
        """
        for path in paths:
            for table in self.row_groups(path, self.schema, partition):
                if table.num_rows:
                    yield table.filter(pa.array(self.survives(table, offset_map, path in mapped)))

    def survives(self, table: pa.Table, offset_map: OffsetMap, mapped: bool) -> np.ndarray:
        """Per record of ``table`` (one file's, ``mapped`` or clean): whether it is its key's
        newest (a mapped file), or its key has no record in the map (a clean file)."""
        if mapped:
            return offset_map.is_newest(table.column(OFFSET).to_numpy())
        return offset_map.lacks(table.select(self.keys))

    @property
    def keys(self) -> list[str]:
        return [k for k in self.key_columns if k != PARTITION]

    def build_offset_map(self, task: PartitionToClean) -> OffsetMap:
        """The partition's map, from the narrow columns of its mapped files only: at once,
        or one bucket of keys per scan, holding only newest offsets between buckets (each
        row's bucket hashed in the first scan and kept, a byte a record)."""
        if task.buckets == 1:
            return self.map_bucket(task, keep_keys=task.probes_keys)
        buckets: list[np.ndarray] = []

        def bucket_of(index: int, canonical: pa.Table) -> np.ndarray:
            if index == len(buckets):
                buckets.append(key_buckets(canonical, task.buckets).astype(np.uint8))
            return buckets[index]

        newest = [
            self.map_bucket(
                task, keep_keys=False, rows=lambda i, c, b=b: bucket_of(i, c) == b
            ).newest
            for b in range(task.buckets)
        ]
        return OffsetMap(np.concatenate(newest))

    def map_bucket(
        self,
        task: PartitionToClean,
        *,
        keep_keys: bool,
        rows: Callable[[int, pa.Table], np.ndarray] | None = None,
    ) -> OffsetMap:
        """The map of the mapped records (only those ``rows`` selects, given the index of a
        row group and its canonical keys), read row group by row group, keys encoded as
        they are read."""
        names = [*self.keys, OFFSET, *([self.sequence_column] if self.sequence_column else [])]
        narrow = pa.schema([self.schema.field(n) for n in names])
        keys, offsets, sequences = [], [], []
        tables = (t for path in task.mapped for t in self.row_groups(path, narrow, task.partition))
        for index, table in enumerate(tables):
            canonical = canonical_keys(table, self.keys, every_validity=True)
            if rows is not None:
                mine = pa.array(rows(index, canonical))
                canonical, table = canonical.filter(mine), table.filter(mine)
            keys.append(canonical)
            offsets.extend(table.column(OFFSET).chunks)
            if self.sequence_column:
                sequences.extend(table.column(self.sequence_column).chunks)
        if not keys:
            empty = canonical_keys(narrow.empty_table(), self.keys, every_validity=True)
            return OffsetMap(np.zeros(0, dtype=np.int64), empty)
        return OffsetMap.build(
            pa.concat_tables(keys),
            pa.chunked_array(offsets, pa.int64()),
            pa.chunked_array(sequences, narrow.field(self.sequence_column).type)
            if self.sequence_column
            else None,
            keep_keys=keep_keys,
        )

    def row_groups(self, path: str, schema: pa.Schema, partition: int) -> Iterator[pa.Table]:
        """The visible records of one file of ``partition``, one row group at a time (what
        bounds a task's memory beside its map), with exactly ``schema``'s columns."""
        fs, root = arrow_filesystem(self.table_uri, self.storage_options)
        floor = self.log_start_offsets.get(partition, 0)
        with fs.open_input_file(f"{root}/{path}") as source:
            parquet = pq.ParquetFile(source)
            present = set(parquet.schema_arrow.names)
            columns = [n for n in schema.names if n in present]
            for index in range(parquet.num_row_groups):
                # Decoded on this (possibly niced) thread, not on Arrow's pool.
                table = parquet.read_row_group(
                    index, columns=columns, use_threads=self.niceness == 0
                )
                if floor > 0 and table.num_rows:
                    table = table.filter(pc.greater_equal(table.column(OFFSET), floor))
                yield _conform(table, schema)

    def retained(
        self, partition: int, group: Sequence[str], offset_map: OffsetMap, mapped: set[str]
    ) -> Iterator[pa.RecordBatch]:
        """The records a group keeps: its `survivors`, then the tombstone rules (KIP-534)."""
        for table in self.survivors(partition, group, offset_map, mapped):
            kept = apply_arrow_tombstone_rules(
                table,
                pass_start_ms=self.pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
                held_below=self.held_below.get(partition),
            )
            yield from kept.to_batches()


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`conform` to ``schema`` with every field nullable, as the files are written."""
    return conform(table, nullable_schema(schema))


def clean_segments(
    spark: SparkSession,
    tasks: Sequence[PartitionToClean],
    *,
    snapshot: LogSnapshot,
    keys: LogKeys,
    pass_start_ms: int,
    delete_retention_ms: int,
    stats_columns: Sequence[str],
    max_file_bytes: int,
    slots: int,
    niceness: int = 0,
    held_below: Mapping[int, int] | None = None,
) -> list[WrittenSegment]:
    """Clean every partition of ``tasks`` of ``snapshot``'s log in at most ``slots`` Spark
    tasks (`packed`), each cleaning its partitions in turn on a thread niced by ``niceness``;
    the files written."""
    partitions = {t.partition for t in tasks}
    task = RecopyTask(
        table_uri=normalize_uri(snapshot.uri),
        storage_options=dict(snapshot.storage_options),
        schema=snapshot.arrow_schema,
        key_columns=keys.key_columns,
        sequence_column=keys.sequence_column,
        tasks=tuple(tasks),
        bins=tuple(tuple(b) for b in packed(tasks, slots)),
        log_start_offsets={p: snapshot.log_start_offset(p) for p in sorted(partitions)},
        pass_start_ms=pass_start_ms,
        delete_retention_ms=delete_retention_ms,
        stats_columns=tuple(stats_columns),
        max_file_bytes=max_file_bytes,
        niceness=niceness,
        held_below=dict(held_below or {}),
    )
    written = bin_rows(spark, len(task.bins)).mapInArrow(task, WRITTEN_SEGMENT_DDL).collect()
    return [WrittenSegment(**row.asDict()) for row in written]


def bin_rows(spark: SparkSession, bins: int) -> DataFrame:
    """One row per bin (`packed`), each in a Spark partition of its own: one task a bin."""
    return spark.range(0, bins, 1, bins).select(F.col("id").cast("int").alias(_BIN))
