"""Absorbing another engine's rearrangement: foreign files rewritten into segments.

An OPTIMIZE, a Z-order, liquid clustering or auto compaction (another engine's
``dataChange=false`` commit) replaces the sink's segments with files of its own:
one file may hold several partitions, clean and dirty records together, in any
row order (`sinks.log.segment.ForeignFile`). Readers stay exact over such files
(they are always dirty, `sinks.reading.state_reader`), but a pass plans over
segments only, so before a pass the cleaner rewrites them back (`absorb`).

The rewrite keeps every visible record and moves none between partitions: the
foreign files' records are grouped by partition and by the gap between the
partition's remaining segments they fall in, sorted by offset, and written as
segments (at most ``segment.bytes`` each), so no new segment overlaps an old one.
Why no record falls inside a remaining segment's range: the foreign files hold
exactly the records of the segments the other engine removed, and a partition's
segments never overlapped. The swap is one commit with ``dataChange=false``,
against the snapshot the rewrite read; a concurrent rewrite of the same files
makes it fail (`ConcurrentCommitError`) and the caller tries again later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks.errors import ConcurrentCommitError
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment_writer import write_segments

_GAP = "_gap"


LatestOffsets = Callable[[DataFrame, LogKeys], DataFrame]
"""The rule for each key's newest record (`sinks.cleaner.rules.spark_latest_offsets`,
passed in by the cleaner: the rules sit a layer above maintenance)."""


@dataclass(frozen=True)
class AbsorbReport:
    """What one rewrite of foreign files did."""

    files_read: int
    bytes_read: int
    segments_written: int
    bytes_written: int
    records: int
    version: int | None

    def summary(self) -> str:
        return (
            f"rewrote {self.files_read} file(s) another engine wrote ({self.bytes_read} B) into "
            f"{self.segments_written} segment(s) ({self.records} records, {self.bytes_written} B)"
        )


def absorb(
    spark: SparkSession,
    log: LogTable,
    snapshot: LogSnapshot,
    *,
    stats_columns: list[str],
    segment_bytes: int,
    keys: LogKeys | None = None,
    latest_offsets: LatestOffsets | None = None,
) -> AbsorbReport | None:
    """Rewrite ``snapshot``'s foreign files into segments in one commit; None when it has none.

    Raises `ConcurrentCommitError` when another commit removed one of those files first
    (the files written here are deleted again).
    """
    foreign = snapshot.foreign_files
    if not foreign:
        return None
    records = (
        log.read(spark, snapshot, foreign)
        .filter(~inside_segments(snapshot))
        .dropDuplicates([PARTITION, OFFSET])
    )
    if keys is not None and latest_offsets is not None:
        records = _clean_below_cleaner_offset(spark, log, snapshot, records, keys, latest_offsets)
    records = records.withColumn(_GAP, gap_index(snapshot))
    written = write_segments(
        records.repartition(PARTITION, _GAP),
        location=log.location,
        schema=snapshot.arrow_schema,
        stats_columns=stats_columns,
        max_file_bytes=segment_bytes,
        group_column=_GAP,
    )
    report = AbsorbReport(
        files_read=len(foreign),
        bytes_read=sum(f.size_bytes for f in foreign),
        segments_written=len(written),
        bytes_written=sum(w.size_bytes for w in written),
        records=sum(w.num_records for w in written),
        version=None,
    )
    try:
        snapshot.commit(
            adds=written,
            removes=foreign,
            data_change=False,
            transactions={},
            info={
                "operation": "absorb",
                "filesRemoved": report.files_read,
                "filesAdded": report.segments_written,
                "records": report.records,
            },
        )
    except ConcurrentCommitError:
        log.location.delete_files(w.path for w in written)
        raise
    after = log.snapshot()
    return AbsorbReport(**{**report.__dict__, "version": after.version if after else None})


def _clean_below_cleaner_offset(
    spark: SparkSession,
    log: LogTable,
    snapshot: LogSnapshot,
    records: DataFrame,
    log_keys: LogKeys,
    latest_offsets: LatestOffsets,
) -> DataFrame:
    """``records`` (foreign) without those below their partition's cleaner offset that a
    newer record of their key below it beats: design.md §6 for the segments written.

    A rearranged record below the cleaner offset came from a clean segment and has no
    rival there; a record a pass had dropped and another engine's OPTIMIZE brought back
    (see `inside_segments`) does, in the pass's output or among the foreign records.
    """
    ends = {p: snapshot.cleaner_offset(p) for p in snapshot.partitions}
    ends = {p: e for p, e in ends.items() if e is not None}
    if not ends:
        return records
    end = F.create_map(*[F.lit(x) for kv in ends.items() for x in kv])[F.col(PARTITION)]
    below = F.coalesce(F.col(OFFSET) < end, F.lit(False))
    by_partition = log_keys.partitioned()
    keys, sequence_column = list(by_partition.key_columns), log_keys.sequence_column
    narrow = list(dict.fromkeys([*keys, *filter(None, [sequence_column]), OFFSET]))
    candidates = records.filter(below).select(*narrow)
    clean = [
        s
        for p, segments in snapshot.segments.items()
        if p in ends
        for s in segments
        if s.base_offset < ends[p]
    ]
    if clean:
        rivals = log.read(spark, snapshot, clean).filter(below).select(*narrow)
        candidates = candidates.unionByName(rivals)
    winners = latest_offsets(candidates, by_partition)
    kept = records.filter(below).join(winners, [*keys, OFFSET], "left_semi")
    return records.filter(~below).unionByName(kept)


def inside_segments(snapshot: LogSnapshot) -> Column:
    """For a record, whether its offset lies within one of its partition's live segments.

    A foreign record never does (see the module docstring) unless the other engine's
    commit resurrected it: delta-rs's OPTIMIZE does not see a concurrent
    ``dataChange=false`` swap (this sink's absorb or pass) that removed one of the files
    it compacts, so it commits after it and brings that file's records back beside the
    swap's copies (same partition and offset). A writer undoes such a commit before it
    writes (`sinks.log.foreign.stale_revert`, design.md §66), an absorb too, so what is left
    for here is a log whose stale rewrite an operator accepted. Such records are dropped
    here, and repeats of one (partition, offset) are written once.
    """
    ranges = {
        p: [(s.base_offset, s.last_offset) for s in segments]
        for p, segments in snapshot.segments.items()
        if segments
    }
    if not ranges:
        return F.lit(False)
    table = F.create_map(
        *[
            x
            for p, r in ranges.items()
            for x in (
                F.lit(p),
                F.array(*[F.struct(F.lit(b).alias("b"), F.lit(e).alias("e")) for b, e in r]),
            )
        ]
    )
    hits = F.filter(
        F.element_at(table, F.col(PARTITION)),
        lambda r: (r["b"] <= F.col(OFFSET)) & (F.col(OFFSET) <= r["e"]),
    )
    return F.coalesce(F.size(hits) > 0, F.lit(False))


def gap_index(snapshot: LogSnapshot) -> Column:
    """For a record, how many of its partition's segments start at or below its offset."""
    bases = {
        p: [s.base_offset for s in segments]
        for p, segments in snapshot.segments.items()
        if segments
    }
    if not bases:
        return F.lit(0)
    table = F.create_map(
        *[x for p, b in bases.items() for x in (F.lit(p), F.array(*[F.lit(o) for o in b]))]
    )
    below = F.filter(F.element_at(table, F.col(PARTITION)), lambda base: base <= F.col(OFFSET))
    return F.coalesce(F.size(below), F.lit(0)).cast("long")
