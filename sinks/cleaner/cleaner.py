"""Kafka's `Cleaner`: one pass over a log, planned on the driver, run as per-partition tasks.

Invariant (Kafka's): *a record with key K and offset O is obsolete if there is
a record with key K and offset O' > O* (with a ``sequence_column``: a higher
(sequence, offset)); the rules live once, in `sinks.cleaner.rules`.

A pass over a log reads every segment below each chosen partition's end offset,
keeps the latest record per key, stamps or drops tombstones by the delete-horizon
rule (KIP-534), writes the survivors grouped into files of at most ``segment.bytes``,
and swaps the old files for the new in one Delta commit with ``dataChange=false``.
Offsets are never rewritten.

As Kafka's cleaner threads each clean one log at a time, each Spark task cleans one
partition (`sinks.cleaner.clean_segments`): it builds the partition's offset map where
it runs and recopies its files. The driver plans from the Delta log alone (which
files, in which groups, where each partition's pass ends so its map fits
``log.cleaner.dedupe.buffer.size``) and commits; it never holds a key. One algorithm
for every key type and for a sequence column: there is no other path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from deltalake.exceptions import CommitFailedError
from pyspark.sql import SparkSession

from sinks.cleaner.clean_segments import clean_segments, partitions_to_clean
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.consumer_holds import held_tombstones
from sinks.cleaner.log_to_clean import LogToClean, group_segments_by_size, segments_to_clean
from sinks.cleaner.offset_map import size_map
from sinks.config import LONG_MAX, CleanerConfig
from sinks.crash_points import CLEAN_BEFORE_COMMIT, crash_point
from sinks.log.log_table import CLEANER_OFFSET_TXN, LogSnapshot, LogTable
from sinks.log.segment import Segment
from sinks.log.segment_writer import WrittenSegment, stats_columns
from sinks.log.storage import delete_files
from sinks.spark_session import default_parallelism


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
    sequence_column: str | None,
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
        sequence_column=sequence_column,
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


class Cleaner:
    """Runs passes over one log. Holds no state between passes.

    ``dedupe_buffer_size`` bounds each task's offset map (`CleanerConfig.dedupe_buffer_size`).
    """

    def __init__(
        self,
        log: LogTable,
        *,
        key_columns: Sequence[str],
        sequence_column: str | None,
        delete_retention_ms: int,
        segment_bytes: int,
        dedupe_buffer_size: int = CleanerConfig().dedupe_buffer_size,
    ) -> None:
        self.log = log
        self.key_columns = tuple(key_columns)
        self.sequence_column = sequence_column
        self.delete_retention_ms = delete_retention_ms
        self.segment_bytes = segment_bytes
        self.dedupe_buffer_size = dedupe_buffer_size

    def plan(self, snapshot: LogSnapshot, logs: Sequence[LogToClean]) -> list[PartitionPlan]:
        """Each chosen partition's share of the next pass, from the Delta log only. Pure."""
        return [
            plan_partition(
                log,
                snapshot.segments.get(log.partition, []),
                cleaner_offset=snapshot.cleaner_offset(log.partition),
                sequence_column=self.sequence_column,
                dedupe_buffer_size=self.dedupe_buffer_size,
            )
            for log in logs
        ]

    def clean(
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
        have not read (`sinks.cleaner.consumer_holds`).

        Raises delta-rs's ``CommitFailedError`` when another cleaner swapped the
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
            tombstones_held=held_tombstones(
                self.log.uri,
                written,
                pass_start_ms=pass_start_ms,
                storage_options=self.log.storage_options,
            )
            if held_below
            else 0,
        )
        crash_point(CLEAN_BEFORE_COMMIT)
        self._commit(snapshot, written, inputs, stats)
        duration = int((time.monotonic() - started) * 1000)
        # The planned-from snapshot stays a value; the version after the pass comes
        # from a fresh read (at or after the pass's own commit when others appended).
        after = self.log.snapshot()
        return replace(stats, duration_ms=duration, delta_version=after.version if after else None)

    def _commit(
        self,
        snapshot: LogSnapshot,
        written: Sequence[WrittenSegment],
        inputs: Sequence[Segment],
        stats: CleanerStats,
    ) -> None:
        """Swap ``inputs`` for ``written`` in one commit against ``snapshot``, recording each
        partition's new cleaner offset; on a conflict the written files are deleted."""
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
        except CommitFailedError:
            # Nothing was committed: the files this pass wrote are garbage now.
            delete_files(self.log.uri, [w.path for w in written], self.log.storage_options)
            raise

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
            table_uri=self.log.uri,
            schema=snapshot.arrow_schema,
            key_columns=self.key_columns,
            sequence_column=self.sequence_column,
            log_start_offsets={
                plan.partition: snapshot.log_start_offset(plan.partition) for plan in plans
            },
            pass_start_ms=pass_start_ms,
            delete_retention_ms=self.delete_retention_ms,
            stats_columns=self.stats_columns(snapshot),
            max_file_bytes=self.segment_bytes,
            storage_options=self.log.storage_options,
            slots=slots,
            niceness=niceness,
            held_below=held_below,
        )

    def stats_columns(self, snapshot: LogSnapshot) -> list[str]:
        """The columns whose statistics each file this log's passes write carries."""
        return stats_columns(snapshot.spark_schema, self.key_columns, self.sequence_column)
