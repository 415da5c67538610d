"""Reading the state out of a compacted log: Kafka's "consume the topic from the start".

A consumer that rebuilds a cache from a compacted topic reads the clean head
(at most one record per key) and then the dirty tail, where later records
override earlier ones. This module does the same with Spark, instead of sorting
every record of the log by key:

    state = (clean ▷ keys(dirty)) ∪ latest(dirty), tombstones dropped

The invariant it rests on (design.md §6, kept by `sinks.cleaner.cleaner`): a pass that
ends at E reads *every* live segment of the partition wholly below E and
replaces them with at most one record per key, and commits E in the log
(``compacted-sink/cleaner-offset/<p>``) in the same commit. Nothing else ever
adds a segment below E: appends start at the log end offset (≥ E), and
retention and ``delete_records`` only remove files or raise the log start
offset, which leaves at most one record per key. So a segment is *clean* when
its last offset lies below the cleaner offset the snapshot records, and *dirty*
otherwise: a segment straddling E, and every segment of a partition the log
records no pass for (never cleaned, or cleaned before the log carried the txn),
is dirty. A dirty record always has a higher offset than a clean one of the same
partition, since a partition's segments never overlap. A file another engine
wrote (`sinks.log.segment.ForeignFile`: an OPTIMIZE may merge partitions and
offset ranges, clean and dirty, into one file) is always dirty: its records
compete by offset with the rest of the tail, which is exact whatever it holds.

"Latest" is the highest offset, or with a ``sequence_column`` the highest
(sequence, offset), within a partition. A key is expected to stay in one
partition (design.md §15); then the result equals grouping the whole log by key,
which is what `sinks.cleaner.rules.latest_records` does. A key found in several
partitions keeps one row per partition, its latest there, as the cleaner keeps
one record per (partition, key): making the partitions agree would mean
shuffling the clean section's keys, the cost this reader exists to avoid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinks.cleaner.offset_map import map_buckets, max_map_records
from sinks.cleaner.rules import spark_latest_offsets
from sinks.config import CleanerConfig
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION, VALUE
from sinks.log.segment import DataFile, ForeignFile, Segment, split_clean

if TYPE_CHECKING:  # `read_state` imports this module without pyspark (design.md §59)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T
from sinks.reading.segment_reader import SegmentReader
from sinks.reading.superseded import BYTES_PER_SUPERSEDED, superseded, superseded_by_spark

# The largest lookup table (estimated, see `broadcast_bytes`) this reader asks Spark
# to broadcast: an eighth of the 1 GiB Spark gives a driver by default, and of
# ``spark.driver.maxResultSize``, which bounds the collect that builds the table.
# The table lives on the driver and once in every executor. About a million dirty
# records with a short string key; above it Spark shuffles instead, and the tail is
# then as large as a good part of the clean section anyway. The estimate against
# Spark's own dataSize metric: docs/benchmarks.md, "Figures kept out of the code".
TAIL_BROADCAST_MAX_BYTES = 128 * 1024 * 1024

_WINNER = "_winner_offset"


@dataclass(frozen=True)
class LogSections:
    """A snapshot's live segments split at each partition's cleaner offset.

    ``clean`` holds at most one record per (partition, key); ``dirty`` holds the rest.
    """

    clean: tuple[Segment, ...]
    dirty: tuple[DataFile, ...]

    @property
    def dirty_records(self) -> int:
        """Records in the dirty segments: a bound on the tail's distinct keys."""
        return sum(s.num_records for s in self.dirty)


def split_at_cleaner_offset(
    segments: Mapping[int, Sequence[Segment]],
    cleaner_offsets: Mapping[int, int | None],
    foreign: Sequence[ForeignFile] = (),
) -> LogSections:
    """Clean: segments wholly below their partition's cleaner offset (`split_clean`). Pure.

    A partition with no recorded offset is all dirty; so is every foreign file.
    """
    clean: list[Segment] = []
    dirty: list[DataFile] = [*foreign]
    for partition, partition_segments in sorted(segments.items()):
        below, above = split_clean(partition_segments, cleaner_offsets.get(partition))
        clean += below
        dirty += above
    return LogSections(tuple(clean), tuple(dirty))


def log_sections(snapshot: LogSnapshot) -> LogSections:
    """``snapshot``'s live files split at each partition's cleaner offset, as the log records it."""
    return split_at_cleaner_offset(
        snapshot.segments,
        {p: snapshot.cleaner_offset(p) for p in snapshot.segments},
        snapshot.foreign_files,
    )


def broadcast_bytes(rows: int, fields: Sequence[T.DataType]) -> int:
    """An estimate of a broadcast hash relation of ``rows`` rows of ``fields``. Pure.

    Spark keeps each row twice (the key row and the row) as an UnsafeRow: an 8-byte
    null bitmap, 8 bytes a field, and variable-width data (counted as 24 bytes, Spark's
    20-byte default size rounded to a word); plus 16 bytes of hash-map entry.
    """
    from pyspark.sql import types as T

    variable_width = (T.StringType, T.BinaryType, T.ArrayType, T.MapType, T.StructType)
    row = 8 + 8 * len(fields) + sum(24 for f in fields if isinstance(f, variable_width))
    return rows * (2 * row + 16)


def spark_state(
    spark: SparkSession,
    log_table: LogTable,
    snapshot: LogSnapshot,
    log_keys: LogKeys,
    *,
    broadcast_max_bytes: int = TAIL_BROADCAST_MAX_BYTES,
    dedupe_buffer_size: int | None = CleanerConfig().dedupe_buffer_size,
    superseded_first: bool = True,
) -> DataFrame:
    """One row per live key of ``snapshot`` (``log_keys``' columns) + ``value``, tombstones
    dropped.

    Same rows, types and nullability as `latest_records` over the whole log followed
    by dropping tombstones, whenever each key stays in one partition (see the module
    docstring for keys that do not). Partitions without a dirty section are Spark's scan
    (filters and column pruning reach it). Those with one are read, in this order of
    preference, when no other engine's file is live:

    - ``superseded_first`` (the default): the superseded records are found from the
      narrow columns, then every row group is read by a task of its own, less them
      (`_state_by_superseded`, design.md §50), when the superseded offsets fit
      ``dedupe_buffer_size``: a partition's read runs on every core;
    - as a pass reads them, one task a partition with its offset map
      (`sinks.reading.partition_state`), when each map fits ``dedupe_buffer_size`` whole;
    - else (or with ``dedupe_buffer_size`` None, or beside another engine's files) by joins
      against the tail's winners, broadcast while their lookup tables stay under
      ``broadcast_max_bytes`` and shuffled above it.

    Records below a log start offset are not read (`LogTable.read`). Reads only;
    ``snapshot`` may be an older version.
    """
    from sinks.reading.partition_state import partition_state

    keys, sequence_column = [*log_keys.key_columns], log_keys.sequence_column
    sections = log_sections(snapshot)
    if not sections.dirty:
        return _live(log_table.read(spark, snapshot, sections.clean), log_keys)
    if superseded_first and dedupe_buffer_size is not None and not snapshot.foreign_files:
        state = _state_by_superseded(
            spark, log_table, snapshot, log_keys, sections, dedupe_buffer_size=dedupe_buffer_size
        )
        if state is not None:
            return state
    if dedupe_buffer_size is not None and not snapshot.foreign_files:
        dirty_partitions = sorted({s.partition for s in sections.dirty})  # type: ignore[union-attr]
        tail = partition_state(
            spark,
            log_table,
            snapshot,
            log_keys,
            dirty_partitions,
            dedupe_buffer_size=dedupe_buffer_size,
        )
        if tail is not None:
            rest = [s for s in sections.clean if s.partition not in dirty_partitions]
            return (
                _live(log_table.read(spark, snapshot, rest), log_keys).unionByName(tail)
                if rest
                else tail
            )
    clean = log_table.read(spark, snapshot, sections.clean)
    dirty = log_table.read(spark, snapshot, sections.dirty)

    types = {f.name: f.dataType for f in snapshot.spark_schema.fields}
    key_types = [types[PARTITION], *(types[k] for k in keys)]
    small = broadcast_bytes(sections.dirty_records, [*key_types, types[OFFSET]])
    small = small <= broadcast_max_bytes

    order = [sequence_column] if sequence_column and sequence_column not in (*keys, OFFSET) else []
    tail = dirty.select(*dict.fromkeys([PARTITION, *keys, *order, OFFSET]))
    if (sequence_column or snapshot.foreign_files) and sections.clean:
        # A clean record may carry a higher sequence than the tail's: it competes too.
        # So it does beside foreign files: a record another engine's OPTIMIZE brought
        # back (see below) may lie below a clean record of its key.
        tail_keys = _hint(tail.select(PARTITION, *keys).distinct(), small)
        rivals = clean.select(*tail.columns).join(tail_keys, [PARTITION, *keys], "left_semi")
        tail = tail.unionByName(rivals)
    by_partition = LogKeys(key_columns=(PARTITION, *keys), sequence_column=sequence_column)
    winners = spark_latest_offsets(tail, by_partition)
    kept = _keep_winners(clean if sections.clean else None, dirty, winners, log_keys, small)
    if snapshot.foreign_files:
        # delta-rs's OPTIMIZE does not see a concurrent dataChange=false swap of this
        # sink that removed a file it compacts: its commit may bring that file's records
        # back beside the swap's copies, until the next pass rewrites them
        # (`sinks.log.foreign.rearrangement.inside_segments`), when an operator accepted
        # it (the sink undoes it otherwise, `sinks.log.foreign.stale_revert`). A repeat is the
        # same record (same partition and offset): the winner is kept once.
        kept = kept.dropDuplicates([PARTITION, *keys])
    return _live(kept, log_keys)


def _state_by_superseded(
    spark: SparkSession,
    log_table: LogTable,
    snapshot: LogSnapshot,
    log_keys: LogKeys,
    sections: LogSections,
    *,
    dedupe_buffer_size: int,
) -> DataFrame | None:
    """The partitions with a dirty section read by tasks a row group at a time, less the
    superseded records (design.md §50); the others scanned by Spark.

    The superseded records are found on the driver from the narrow columns
    (`sinks.reading.superseded`, on every core); then every row group of those partitions'
    files is read once, on every core (`sinks.reading.kept_row_groups`). The contenders are
    weighed in buckets of keys when they would not fit ``dedupe_buffer_size`` at once
    (`map_buckets`, as a pass's map); by Spark when more buckets than a pass takes would be
    needed (`superseded_by_spark`: only the losers' offsets reach the driver); None (another
    rule reads the state) when even those would not fit ``dedupe_buffer_size``.
    """
    from pyspark.sql import types as T

    from sinks.reading.kept_row_groups import kept_records
    from sinks.spark_session import default_parallelism

    dirty_partitions = {s.partition for s in sections.dirty}  # type: ignore[union-attr]
    near = [s for s in sections.clean if s.partition in dirty_partitions]
    rest = [s for s in sections.clean if s.partition not in dirty_partitions]
    contenders = sections.dirty_records + min(
        sections.dirty_records, sum(s.num_records for s in near)
    )
    buckets = (
        1
        if contenders <= max_map_records(dedupe_buffer_size)
        else map_buckets(contenders, dedupe_buffer_size)
    )
    if buckets is None and sections.dirty_records * BYTES_PER_SUPERSEDED > dedupe_buffer_size:
        return None
    segments = [*near, *sections.dirty]
    snapshot.check_files(segments)
    reader = SegmentReader.of(snapshot)
    if buckets is None:  # too many contenders for the driver: Spark weighs them
        found = superseded_by_spark(spark, log_table, snapshot, log_keys, near, sections.dirty)
    else:
        found = superseded(snapshot, log_keys, near, sections.dirty, reader, buckets=buckets)
    fields = {f.name: f for f in snapshot.spark_schema.fields}
    columns = [*log_keys.key_columns, VALUE]
    out = T.StructType([T.StructField(c, fields[c].dataType, True) for c in columns])
    slots = default_parallelism(spark)
    tail = kept_records(spark, reader, snapshot.arrow_schema, out, segments, found.offsets, slots)
    if not rest:
        return tail
    return _live(log_table.read(spark, snapshot, rest), log_keys).unionByName(tail)


def _keep_winners(
    clean: DataFrame | None,
    dirty: DataFrame,
    winners: DataFrame,
    keys: LogKeys,
    small: bool,
) -> DataFrame:
    """The tail's rows at their key's winning offset, and the clean rows no tail key beats.

    One lookup table of (partition, keys, winning offset) serves both joins, both on
    (partition, keys) with a condition on the winner's offset, so Spark scans and
    shuffles the tail's narrow columns once for the two (it reuses the exchange).
    A clean row is dropped when its key has a winner at another offset: without a
    sequence every tail key's winner lies in the tail, above every clean offset of
    its partition; with one, the winner may be the clean row itself, which stays.
    """
    from pyspark.sql import functions as F

    key_columns = keys.key_columns
    on = [PARTITION, *key_columns]
    table = _hint(winners.withColumnRenamed(OFFSET, _WINNER), small).alias("w")

    def join(records: DataFrame, alias: str, keep_winner: bool, how: str) -> DataFrame:
        offset = F.col(f"{alias}.{OFFSET}")
        condition = offset == F.col(_WINNER) if keep_winner else offset != F.col(_WINNER)
        matched = [F.col(f"{alias}.{k}") == F.col(f"w.{k}") for k in on] + [condition]
        kept = records.alias(alias).join(table, matched, how)
        names = dict.fromkeys([PARTITION, *key_columns, VALUE])
        return kept.select(*[F.col(f"{alias}.{k}") for k in names])

    tail = join(dirty, "d", True, "left_semi")
    return tail if clean is None else join(clean, "c", False, "left_anti").unionByName(tail)


def _hint(df: DataFrame, small: bool) -> DataFrame:
    from pyspark.sql import functions as F

    return F.broadcast(df) if small else df


def _live(records: DataFrame, keys: LogKeys) -> DataFrame:
    from pyspark.sql import functions as F

    return records.select(*keys.key_columns, VALUE).filter(F.col(VALUE).isNotNull())
