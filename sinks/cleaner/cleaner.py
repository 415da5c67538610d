"""The cleaning algorithm: Kafka's `Cleaner`, as DataFrame → DataFrame functions, and one pass.

Invariant (Kafka's): *a record with key K and offset O is obsolete if there is
a record with key K and offset O' > O*. Here keys are compared exactly, by a
Spark aggregate grouped on the key columns, never through a hash of the key:
two distinct keys whose digests collide both survive. With a ``sequence_column``
"newer" means a higher sequence value, ties broken by offset.

A pass over a log reads every segment below each chosen partition's first
uncleanable offset, keeps the latest record per key, stamps or drops
tombstones by the delete-horizon rule (KIP-534), writes the survivors grouped
into files of at most ``segment.bytes``, and swaps the old files for the new in
one Delta commit with ``dataChange=false``. Offsets are never rewritten.

An offset names one record of its partition, so a pass finds the survivors
from the narrow columns only (partition, key, sequence, offset: Kafka's offset
map, built exactly) and keeps the scanned rows whose (partition, offset) is a
survivor. Values never go through an aggregate; on the broadcast path they
never go through a shuffle either: each output group of input segments is read
and written by its own task.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from deltalake.exceptions import CommitFailedError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks.cleaner.clean_segments import clean_segments
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.cleaner.consumer_holds import held_tombstones
from sinks.cleaner.log_to_clean import LogToClean, group_segments_by_size, segments_to_clean
from sinks.cleaner.offset_map import (
    MAX_OFFSET_MAP_RECORDS,
    build_offset_map,
    dirty_segments,
    is_mappable,
)
from sinks.config import LONG_MAX
from sinks.crash_points import CLEAN_BEFORE_COMMIT, crash_point
from sinks.log.log_table import CLEANER_OFFSET_TXN, LogSnapshot, LogTable
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE
from sinks.log.segment import Segment
from sinks.log.segment_writer import stats_columns, write_segments
from sinks.log.storage import delete_files
from sinks.spark_session import default_parallelism

# The survivors' (partition, offset) pairs are broadcast when a pass reads at most
# this many records. The survivors are never more than the records read, and Spark
# holds a broadcast relation of (int, long) rows at roughly 100 bytes a row (an
# estimate, not measured) on the driver and on each executor: 2 M records bound it
# near 200 MB, a fifth of Spark's default 1 GB driver. Above it the semi join is
# shuffled: it spills instead of running out of memory, but values then move.
BROADCAST_MAX_RECORDS = 2_000_000
# A pass smaller than segment.bytes per core still writes with every core: its
# groups are cut to its input bytes / default parallelism, but never below this, so
# that small passes keep writing one file. Measured on an idle 2-core machine (one
# 20.8 MB never-cleaned log, best of 3): 4.27 s in three groups against 4.70 s in one.
MIN_GROUP_BYTES = 8 * 1024 * 1024

_GROUP = "_output_group"
_LATEST = "_latest"


def latest_records(
    df: DataFrame, key_columns: Sequence[str], sequence_column: str | None = None
) -> DataFrame:
    """One row per key: its newest record (highest sequence then offset), all columns kept.

    Aggregates whole rows (a sort-based ``max_by`` over a struct of every column):
    for reading state. A pass uses `latest_offsets` and a semi join instead.
    """
    order = F.struct(*([F.col(sequence_column)] if sequence_column else []), F.col(OFFSET))
    rest = [c for c in df.columns if c not in key_columns]
    latest = df.groupBy(*key_columns).agg(F.max_by(F.struct(*rest), order).alias(_LATEST))
    return latest.select(*key_columns, *[F.col(f"{_LATEST}.{c}").alias(c) for c in rest])


def latest_offsets(
    df: DataFrame, key_columns: Sequence[str], sequence_column: str | None = None
) -> DataFrame:
    """(partition, offset) of each key's newest record, from the narrow columns only.

    Without a sequence column this is ``max(offset)`` per (partition, key), a hash
    aggregate over longs; with one, the offset of ``max_by`` over (sequence, offset).
    Keys are grouped by value, so distinct keys never merge.
    """
    groups = [PARTITION, *[k for k in key_columns if k != PARTITION]]
    if sequence_column:
        order = F.struct(F.col(sequence_column), F.col(OFFSET))
        newest = F.max_by(F.col(OFFSET), order)
    else:
        newest = F.max(F.col(OFFSET))
    return df.groupBy(*groups).agg(newest.alias(OFFSET)).select(PARTITION, OFFSET)


def keep_offsets(df: DataFrame, survivors: DataFrame) -> DataFrame:
    """The rows of ``df`` whose (partition, offset) is in ``survivors`` (a left semi join)."""
    return df.join(survivors, [PARTITION, OFFSET], "left_semi").select(*df.columns)


def drop_tombstones(df: DataFrame) -> DataFrame:
    """Records whose value is not null (the live state)."""
    return df.filter(F.col(VALUE).isNotNull())


def drop_expired_tombstones(
    df: DataFrame, *, pass_start_ms: int, held_below: Mapping[int, int] | None = None
) -> DataFrame:
    """Remove tombstones whose delete horizon lies before this pass's start, except those at
    or above their partition's ``held_below`` (`sinks.cleaner.consumer_holds`)."""
    expired = (
        F.col(VALUE).isNull()
        & F.col(DELETE_HORIZON_MS).isNotNull()
        & (F.col(DELETE_HORIZON_MS) < F.lit(pass_start_ms))
    )
    if held_below:
        floor = F.create_map(*[F.lit(x) for kv in held_below.items() for x in kv])
        expired = expired & ~F.coalesce(F.col(OFFSET) >= floor[F.col(PARTITION)], F.lit(False))
    return df.filter(~expired)


def stamp_delete_horizon(
    df: DataFrame, *, pass_start_ms: int, delete_retention_ms: int
) -> DataFrame:
    """Give each unstamped tombstone the horizon ``pass_start_ms + delete_retention_ms``."""
    unstamped = F.col(VALUE).isNull() & F.col(DELETE_HORIZON_MS).isNull()
    horizon = F.lit(pass_start_ms + delete_retention_ms).cast("long")
    return df.withColumn(
        DELETE_HORIZON_MS, F.when(unstamped, horizon).otherwise(F.col(DELETE_HORIZON_MS))
    )


def apply_tombstone_rules(
    df: DataFrame,
    *,
    pass_start_ms: int,
    delete_retention_ms: int,
    held_below: Mapping[int, int] | None = None,
) -> DataFrame:
    """KIP-534 on kept records, one row at a time: drop expired tombstones, stamp new ones."""
    kept = drop_expired_tombstones(df, pass_start_ms=pass_start_ms, held_below=held_below)
    return stamp_delete_horizon(
        kept, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
    )


def retain_latest(
    df: DataFrame,
    *,
    key_columns: Sequence[str],
    sequence_column: str | None,
    pass_start_ms: int,
    delete_retention_ms: int,
) -> DataFrame:
    """What a pass keeps of the records it read: latest per key, tombstones by KIP-534.

    Every column of ``df`` is kept; Spark chooses how to join (a pass chooses itself).
    """
    survivors = latest_offsets(df, key_columns, sequence_column)
    return keep_offsets(df, survivors).transform(
        lambda d: apply_tombstone_rules(
            d, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
        )
    )


class Cleaner:
    """Runs passes over one log. Holds no state between passes.

    ``broadcast_max_records`` is the largest pass (in records read) whose survivors
    are broadcast; larger passes shuffle the semi join (see `BROADCAST_MAX_RECORDS`).
    """

    def __init__(
        self,
        log: LogTable,
        *,
        key_columns: Sequence[str],
        sequence_column: str | None,
        delete_retention_ms: int,
        segment_bytes: int,
        broadcast_max_records: int = BROADCAST_MAX_RECORDS,
        offset_map_max_records: int = MAX_OFFSET_MAP_RECORDS,
    ) -> None:
        self.log = log
        self.key_columns = tuple(key_columns)
        self.sequence_column = sequence_column
        self.delete_retention_ms = delete_retention_ms
        self.segment_bytes = segment_bytes
        self.broadcast_max_records = broadcast_max_records
        self.offset_map_max_records = offset_map_max_records

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

        ``max_tasks`` caps how many Spark tasks the pass runs at once (a background
        pass leaves the other cores to the query); None: every core. Kafka's pass runs
        its tasks on threads niced by ``niceness``; the Spark path ignores it.
        ``held_below`` keeps expired tombstones registered consumers have not read
        (`sinks.cleaner.consumer_holds`).

        Raises delta-rs's ``CommitFailedError`` when another cleaner swapped the
        same files first; the files this pass wrote are then orphans for recovery.
        A crash anywhere leaves either the old files or the new ones live, never both.
        """
        started = time.monotonic()
        if snapshot.foreign_files:
            raise ValueError("a pass plans over segments: rewrite the foreign files first")
        chosen = [
            segments_to_clean(
                snapshot.segments.get(log.partition, []), log.first_uncleanable_offset
            )
            for log in logs
        ]
        inputs: list[Segment] = [s for segments in chosen for s in segments]
        snapshot.check_files(inputs)  # a lost or truncated input fails the pass by name
        group_bytes = group_size(
            sum(s.size_bytes for s in inputs),
            segment_bytes=self.segment_bytes,
            parallelism=min(default_parallelism(spark), max_tasks or LONG_MAX),
        )
        groups = [g for segments in chosen for g in group_segments_by_size(segments, group_bytes)]
        written = []
        dirty = [
            s
            for log, segments in zip(logs, chosen, strict=True)
            for s in dirty_segments(
                segments,
                first_dirty_offset=log.first_dirty_offset,
                cleaner_offset=snapshot.cleaner_offset(log.partition),
            )
        ]
        if groups and self.uses_offset_map(snapshot, dirty):
            written = clean_segments(
                spark,
                groups,
                build_offset_map(
                    snapshot,
                    dirty,
                    self.key_columns,
                    table_uri=self.log.uri,
                    storage_options=self.log.storage_options,
                    max_tasks=max_tasks,
                    niceness=niceness,
                ),
                table_uri=self.log.uri,
                schema=snapshot.arrow_schema,
                key_columns=self.key_columns,
                log_start_offsets={
                    log.partition: snapshot.log_start_offset(log.partition) for log in logs
                },
                pass_start_ms=pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
                stats_columns=self.stats_columns(snapshot),
                max_file_bytes=self.segment_bytes,
                storage_options=self.log.storage_options,
                max_tasks=max_tasks,
                niceness=niceness,
                held_below=held_below,
            )
        elif groups:
            written = write_segments(
                self.retained(
                    spark, snapshot, inputs, groups, pass_start_ms=pass_start_ms, held=held_below
                ),
                table_uri=self.log.uri,
                schema=snapshot.arrow_schema,
                stats_columns=self.stats_columns(snapshot),
                max_file_bytes=self.segment_bytes,
                group_column=_GROUP,
                storage_options=self.log.storage_options,
            )
        end_offsets = {log.partition: log.first_uncleanable_offset for log in logs}
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
        try:
            snapshot.commit(
                adds=written,
                removes=inputs,
                data_change=False,
                transactions={CLEANER_OFFSET_TXN.format(p): e for p, e in end_offsets.items()},
                info={
                    "operation": "clean",
                    "passStartMs": pass_start_ms,
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
        duration = int((time.monotonic() - started) * 1000)
        # The planned-from snapshot stays a value; the version after the pass comes
        # from a fresh read (at or after the pass's own commit when others appended).
        after = self.log.snapshot()
        return replace(stats, duration_ms=duration, delta_version=after.version if after else None)

    def stats_columns(self, snapshot: LogSnapshot) -> list[str]:
        """The columns whose statistics each file this log's passes write carries."""
        return stats_columns(snapshot.spark_schema, self.key_columns, self.sequence_column)

    def uses_offset_map(self, snapshot: LogSnapshot, dirty: Sequence[Segment]) -> bool:
        """Whether a pass runs as Kafka's (offset map of the dirty section, one recopy).

        Not with a sequence column (a clean record may beat a dirty one), not with
        key types pyarrow and Spark compare differently, and not when the map could
        pass ``offset_map_max_records`` (the shuffled path spills instead).
        """
        schema = snapshot.arrow_schema
        return (
            self.sequence_column is None
            and all(is_mappable(schema.field(k).type) for k in self.key_columns)
            and sum(s.num_records for s in dirty) <= self.offset_map_max_records
        )

    def retained(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        inputs: Sequence[Segment],
        groups: Sequence[Sequence[Segment]],
        *,
        pass_start_ms: int,
        held: Mapping[int, int] | None = None,
    ) -> DataFrame:
        """The records a pass keeps of ``inputs``, with the index of their group in ``_GROUP``.

        ``groups`` partition ``inputs`` into runs of consecutive segments, one output
        file each (`group_segments_by_size`). Up to ``broadcast_max_records`` records
        read, each group is scanned, semi-joined with the broadcast survivors and kept
        in one task (``coalesce(1)``; the union keeps tasks apart), so kept rows are
        never shuffled. Above, one shuffled semi join, then a shuffle of kept rows by
        group, as each group must be written by one task.

        A group is not split across tasks for parallelism: measured on 2 shared cores
        (one 15 MB group), two tasks writing halves were slower than one (best of
        five, 6.6 s against 5.6 s) and double the files.
        """
        survivors = latest_offsets(
            self.log.read(spark, snapshot, inputs), self.key_columns, self.sequence_column
        )

        def rules(df: DataFrame) -> DataFrame:
            return apply_tombstone_rules(
                df,
                pass_start_ms=pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
                held_below=held,
            )

        if sum(s.num_records for s in inputs) <= self.broadcast_max_records:
            survivors = F.broadcast(survivors)
            parts = [
                keep_offsets(self.log.read(spark, snapshot, group), survivors)
                .transform(rules)
                .withColumn(_GROUP, F.lit(index))
                .coalesce(1)
                for index, group in enumerate(groups)
            ]
            return functools.reduce(DataFrame.union, parts)
        kept = keep_offsets(self.log.read(spark, snapshot, inputs), survivors.hint("shuffle_hash"))
        return (
            kept.transform(rules)
            .withColumn(_GROUP, _group_index(groups))
            .repartition(len(groups), PARTITION, _GROUP)
        )


def group_size(input_bytes: int, *, segment_bytes: int, parallelism: int) -> int:
    """The input bytes per output group: ``segment.bytes``, or less so every core writes.

    Each group is read, joined and written by one task, so a pass with fewer groups
    than cores leaves cores idle; groups are never cut below `MIN_GROUP_BYTES`.
    """
    per_core = -(-input_bytes // max(1, parallelism))
    return min(segment_bytes, max(MIN_GROUP_BYTES, per_core))


def _group_index(groups: Sequence[Sequence[Segment]]) -> Column:
    """The index of the group a record's (partition, offset) falls in (a flat CASE)."""
    cases: Column | None = None
    for index, group in enumerate(groups):
        test = (
            (F.col(PARTITION) == group[0].partition)
            & (F.col(OFFSET) >= group[0].base_offset)
            & (F.col(OFFSET) <= group[-1].last_offset)
        )
        cases = F.when(test, F.lit(index)) if cases is None else cases.when(test, F.lit(index))
    assert cases is not None, "a pass writes at least one group"
    return cases
