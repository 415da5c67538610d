"""The cleaning algorithm: Kafka's `Cleaner`, as DataFrame → DataFrame functions, and one pass.

Invariant (Kafka's): *a record with key K and offset O is obsolete if there is
a record with key K and offset O' > O*. Here keys are compared exactly, through
a Spark shuffle, never through a hash of the key: two distinct keys whose
digests collide both survive. With a ``sequence_column`` "newer" means a higher
sequence value, ties broken by offset.

A pass over a log reads every segment below each chosen partition's first
uncleanable offset, keeps the latest record per key, stamps or drops
tombstones by the delete-horizon rule (KIP-534), writes the survivors grouped
into files of at most ``segment.bytes``, and swaps the old files for the new in
one Delta commit with ``dataChange=false``. Offsets are never rewritten.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from deltalake.exceptions import CommitFailedError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks.cleaner_stats import CleanerStats
from sinks.crash_points import CLEAN_BEFORE_COMMIT, crash_point
from sinks.log_table import CLEANER_OFFSET_TXN, LogSnapshot, LogTable
from sinks.log_to_clean import LogToClean, group_segments_by_size, segments_to_clean
from sinks.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE
from sinks.segment_writer import write_segments
from sinks.storage import delete_files

_GROUP = "_output_group"
_LATEST = "_latest"


def latest_records(
    df: DataFrame, key_columns: Sequence[str], sequence_column: str | None = None
) -> DataFrame:
    """One row per key: its newest record (highest sequence then offset), all columns kept."""
    order = F.struct(*([F.col(sequence_column)] if sequence_column else []), F.col(OFFSET))
    rest = [c for c in df.columns if c not in key_columns]
    latest = df.groupBy(*key_columns).agg(F.max_by(F.struct(*rest), order).alias(_LATEST))
    return latest.select(*key_columns, *[F.col(f"{_LATEST}.{c}").alias(c) for c in rest])


def drop_tombstones(df: DataFrame) -> DataFrame:
    """Records whose value is not null (the live state)."""
    return df.filter(F.col(VALUE).isNotNull())


def drop_expired_tombstones(df: DataFrame, *, pass_start_ms: int) -> DataFrame:
    """Remove tombstones whose delete horizon lies before this pass's start."""
    expired = (
        F.col(VALUE).isNull()
        & F.col(DELETE_HORIZON_MS).isNotNull()
        & (F.col(DELETE_HORIZON_MS) < F.lit(pass_start_ms))
    )
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


def retain_latest(
    df: DataFrame,
    *,
    key_columns: Sequence[str],
    sequence_column: str | None,
    pass_start_ms: int,
    delete_retention_ms: int,
) -> DataFrame:
    """What a pass keeps of the records it read: latest per key, tombstones by KIP-534."""
    keys = [PARTITION, *key_columns]  # a key lives in one partition; this keeps passes apart
    return (
        df.transform(lambda d: latest_records(d, keys, sequence_column))
        .transform(lambda d: drop_expired_tombstones(d, pass_start_ms=pass_start_ms))
        .transform(
            lambda d: stamp_delete_horizon(
                d, pass_start_ms=pass_start_ms, delete_retention_ms=delete_retention_ms
            )
        )
    )


class Cleaner:
    """Runs passes over one log. Holds no state between passes."""

    def __init__(
        self,
        log: LogTable,
        *,
        key_columns: Sequence[str],
        sequence_column: str | None,
        delete_retention_ms: int,
        segment_bytes: int,
    ) -> None:
        self.log = log
        self.key_columns = tuple(key_columns)
        self.sequence_column = sequence_column
        self.delete_retention_ms = delete_retention_ms
        self.segment_bytes = segment_bytes

    def clean(
        self,
        spark: SparkSession,
        snapshot: LogSnapshot,
        logs: Sequence[LogToClean],
        *,
        pass_start_ms: int,
    ) -> CleanerStats:
        """One pass over the given partitions, committed atomically against ``snapshot``.

        Raises delta-rs's ``CommitFailedError`` when another cleaner swapped the
        same files first; the files this pass wrote are then orphans for recovery.
        A crash anywhere leaves either the old files or the new ones live, never both.
        """
        started = time.monotonic()
        inputs = []
        groups: dict[int, list[int]] = {}
        for log in logs:
            segments = segments_to_clean(
                snapshot.segments.get(log.partition, []), log.first_uncleanable_offset
            )
            inputs += segments
            grouped = group_segments_by_size(segments, self.segment_bytes)
            groups[log.partition] = [group[0].base_offset for group in grouped]
        retained = self.log.read(spark, snapshot, inputs).transform(
            lambda d: retain_latest(
                d,
                key_columns=self.key_columns,
                sequence_column=self.sequence_column,
                pass_start_ms=pass_start_ms,
                delete_retention_ms=self.delete_retention_ms,
            )
        )
        retained = retained.withColumn(_GROUP, _output_group(groups))
        tasks = max(1, sum(len(g) for g in groups.values()))
        written = write_segments(
            retained.repartition(tasks, PARTITION, _GROUP),
            table_uri=self.log.uri,
            schema=snapshot.arrow_schema,
            stats_columns=stats_columns(snapshot, self.key_columns, self.sequence_column),
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


def stats_columns(
    snapshot: LogSnapshot, key_columns: Sequence[str], sequence_column: str | None
) -> list[str]:
    """The columns whose min/max/null counts go into each file's Delta statistics."""
    names = [*key_columns, PARTITION, OFFSET, "timestamp", DELETE_HORIZON_MS]
    if sequence_column:
        names.append(sequence_column)
    present = set(snapshot.spark_schema.names)
    return [n for n in dict.fromkeys(names) if n in present]


def _output_group(boundaries: dict[int, list[int]]) -> Column:
    """The index of the output file group an offset falls in, per partition (a flat CASE)."""
    cases: Column | None = None
    for partition, bases in boundaries.items():
        for index in range(len(bases) - 1, 0, -1):
            test = (F.col(PARTITION) == partition) & (F.col(OFFSET) >= bases[index])
            cases = F.when(test, F.lit(index)) if cases is None else cases.when(test, F.lit(index))
    return F.lit(0) if cases is None else cases.otherwise(F.lit(0))
