"""The records a state does not show, decided from narrow columns before any payload is read.

    state = live files ▷ superseded, tombstones dropped

A record is *superseded* when another record of its (partition, key) is newer
(`sinks.log.latest`: the highest offset, or with a ``sequence_column`` the highest
(sequence, offset)). Only keys with a record in the dirty tail can have one: the clean
section holds at most one record per key (design.md §6). So the contenders are the tail's
records and the clean records of the tail's keys (the *rivals*), and the winners among
them are found from their partition, key, sequence and offset columns alone; everything
else a contender holds (the value and payload, most of a record's bytes) is read later,
and only for the records that are not superseded (design.md §50).

Keys are compared by value, in their canonical encoding (`sinks.cleaner.offset_map.
canonical_keys`: as Spark groups them), never by a hash: no key is lost to a collision.
The result is each partition's superseded offsets, sorted, and the same as an Arrow
table (``partition``, ``offset``) for a broadcast anti-join in Spark. Its memory is the
tail's narrow columns and the rivals'; the clean section's keys are streamed, file by
file, on every core (`sinks.reading.segment_reader.ordered_map`). When those would not fit
``log.cleaner.dedupe.buffer.size``, the contenders are weighed a bucket of keys at a time
(`weighing_buckets`; `sinks.cleaner.offset_map.key_buckets`, a hash of the canonical key,
so that a key's records all fall in one bucket and no key is lost to a collision), each
bucket's losers kept (eight bytes a record) before the next bucket is read. Reads only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sinks.cleaner.offset_map import canonical_keys, key_buckets, max_map_records
from sinks.log.latest import latest_offsets
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogSnapshot, LogTable
from sinks.log.records import OFFSET, PARTITION
from sinks.log.segment import DataFile, ForeignFile, Segment
from sinks.reading.segment_reader import SegmentReader, ordered_map

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SEQUENCE = "_sequence"
_NOT_KEYS = (PARTITION, _SEQUENCE, OFFSET)
# The fewest clean records joined against the tail's keys at once (`_rivals`).
MIN_JOIN_ROWS = 65_536
_HASH_ROWS = 2_048


@dataclass(frozen=True)
class Superseded:
    """Each partition's superseded offsets (sorted, distinct), how many contenders were
    weighed to find them, and in how many buckets of keys."""

    offsets: dict[int, np.ndarray]
    contenders: int  # -1: not counted (Spark weighed them)
    buckets: int = 1

    @property
    def count(self) -> int:
        return sum(len(o) for o in self.offsets.values())

    def table(self, schema: pa.Schema) -> pa.Table:
        """(``partition``, ``offset``) of every superseded record, with ``schema``'s types."""
        partitions = [np.full(len(o), p) for p, o in self.offsets.items()]
        offsets = list(self.offsets.values())
        return pa.table(
            {
                PARTITION: pa.array(
                    np.concatenate(partitions) if partitions else np.zeros(0, np.int64)
                ).cast(schema.field(PARTITION).type),
                OFFSET: pa.array(
                    np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
                ).cast(schema.field(OFFSET).type),
            }
        )


def own_keys(keys: LogKeys) -> list[str]:
    """The key columns without ``partition``."""
    return [k for k in keys.key_columns if k != PARTITION]


def sequence_of(keys: LogKeys) -> str | None:
    """The column that orders a key's records before the offset, if any."""
    sequence = keys.sequence_column
    return sequence if sequence and sequence not in (*keys.key_columns, PARTITION, OFFSET) else None


def superseded(
    snapshot: LogSnapshot,
    keys: LogKeys,
    clean: Sequence[DataFile],
    dirty: Sequence[DataFile],
    reader: SegmentReader,
    threads: int | None = None,
    buckets: int = 1,
) -> Superseded:
    """The superseded records of ``snapshot`` whose live files are ``clean`` (at most one
    record per (partition, key) each) and ``dirty``. Reads the narrow columns only, once
    for each of ``buckets`` buckets of keys (`key_buckets`): the contenders held at a time
    are a bucket's, about a ``buckets``-th of them, beside the losers of the buckets before
    (each partition's offsets, eight bytes a record)."""
    sequence = sequence_of(keys)
    names = [PARTITION, *own_keys(keys), *([sequence] if sequence else []), OFFSET]
    narrow = pa.schema([snapshot.arrow_schema.field(n) for n in dict.fromkeys(names)])
    lost: dict[int, list[np.ndarray]] = {}
    # Each file's records' buckets, hashed in the first bucket's scan (a byte a record): the
    # hash costs more than decoding the narrow columns again.
    assigned: dict[str, list[np.ndarray]] = {}
    weighed = 0
    for bucket in range(buckets):

        def contenders(segment: DataFile, bucket: int = bucket) -> list[pa.Table]:
            tables = [_encoded(t, keys, sequence) for t in reader.read(segment, narrow)]
            if buckets == 1:
                return tables
            if segment.path not in assigned:
                assigned[segment.path] = [_buckets_of(t, buckets) for t in tables]
            ids = assigned[segment.path]
            return [t.filter(pa.array(i == bucket)) for t, i in zip(tables, ids, strict=True)]

        found = _bucket_losers(snapshot, clean, dirty, contenders, sequence, threads)
        if found is not None:
            for partition, offsets in _by_partition(found[0]).items():
                lost.setdefault(partition, []).append(offsets)
            weighed += found[1]
    return Superseded({p: _merged(o) for p, o in sorted(lost.items())}, weighed, buckets)


def weighing_buckets(contenders: int, dedupe_buffer_size: int) -> int:
    """How many buckets of keys ``contenders`` are weighed in on this process so that each
    bucket's fit ``dedupe_buffer_size`` (`max_map_records`: a pass's map's cost a record),
    however many buckets that takes. Pure."""
    return max(1, -(-contenders // max_map_records(dedupe_buffer_size)))


def rival_files(clean: Sequence[DataFile], dirty: Sequence[DataFile]) -> list[DataFile]:
    """The ``clean`` files that may hold a rival: those of a partition ``dirty`` may hold
    records of (every one, beside another engine's file without partition statistics). Pure."""
    if any(isinstance(f, ForeignFile) and f.partitions is None for f in dirty):
        return list(clean)
    segments = [f for f in dirty if isinstance(f, Segment)]
    foreign = [f for f in dirty if isinstance(f, ForeignFile)]
    partitions = {s.partition for s in segments}

    def near(file: DataFile) -> bool:
        if not isinstance(file, Segment):
            return True
        return file.partition in partitions or any(f.may_hold(file.partition) for f in foreign)

    return [f for f in clean if near(f)]


def contenders_bound(clean: Sequence[DataFile], dirty: Sequence[DataFile]) -> int:
    """At most how many contenders ``dirty`` and its rivals in ``clean`` (`rival_files`) hold:
    the tail's records, and as many rivals (one clean record a tail key at most). Pure."""
    tail = sum(f.num_records for f in dirty)
    return tail + min(tail, sum(f.num_records for f in clean))


BYTES_PER_SUPERSEDED = 16
"""What the driver holds per superseded record that Spark weighed: its partition and offset."""


def superseded_by_spark(
    spark: SparkSession,
    log_table: LogTable,
    snapshot: LogSnapshot,
    keys: LogKeys,
    clean: Sequence[DataFile],
    dirty: Sequence[DataFile],
) -> Superseded:
    """`superseded`, weighed by Spark: for contenders too many for the driver's buffer in
    the buckets a pass takes. The same narrow columns are read (the tail's, and the clean
    section's of the tail's partitions: a clean record whose key the tail lacks is its
    key's only record, so it never loses) and shuffled once, by key; each key's records
    but its newest are the losers, and only their partition and offset come back to the
    driver, `BYTES_PER_SUPERSEDED` each. Spark groups the keys and orders a key's records
    as `sinks.cleaner.rules.spark_latest_offsets` does (sequence, nulls lowest, then
    offset)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from sinks.spark_compat import to_arrow

    sequence = sequence_of(keys)
    group = [PARTITION, *own_keys(keys)]
    names = list(dict.fromkeys([*group, *([sequence] if sequence else []), OFFSET]))
    contenders = log_table.read(spark, snapshot, [*clean, *dirty]).select(*names)
    newest_first = [*([F.col(sequence).desc_nulls_last()] if sequence else []), F.desc(OFFSET)]
    rank = F.row_number().over(Window.partitionBy(*group).orderBy(*newest_first))
    losers = contenders.select(PARTITION, OFFSET, rank.alias("_rank")).where("_rank > 1")
    table = to_arrow(losers.select(PARTITION, OFFSET))
    return Superseded(_by_partition(table) if table.num_rows else {}, -1)


def _bucket_losers(
    snapshot: LogSnapshot,
    clean: Sequence[DataFile],
    dirty: Sequence[DataFile],
    contenders: Callable[[DataFile], list[pa.Table]],
    sequence: str | None,
    threads: int | None,
) -> tuple[pa.Table, int] | None:
    """(partition, offset) of the losing ``contenders`` of ``clean`` and ``dirty``, and how
    many were weighed; None when the tail has none."""
    tail = _concat([t for ts in ordered_map(contenders, dirty, threads) for t in ts])
    if tail is None:
        return None
    group = [n for n in tail.column_names if n not in (_SEQUENCE, OFFSET)]
    order = _SEQUENCE if sequence else None
    tail_winners = _newest(tail, group, order)
    lost = [_losers(tail, tail_winners)]

    clean_keys = (t for ts in ordered_map(contenders, clean, threads) for t in ts)
    tail_keys = tail_winners.select(group)
    found = _concat([t for t in _rivals(clean_keys, tail_keys, group) if t.num_rows])
    weighed = tail.num_rows
    if found is not None:
        weighed += found.num_rows
        if sequence is None and not snapshot.foreign_files:
            # A tail record's offset is above every clean offset of its partition: every
            # rival loses. (Another engine's file may hold any offsets.)
            lost.append(found.select([PARTITION, OFFSET]))
        else:  # a clean record with a higher sequence may beat the tail's newest
            everyone = pa.concat_tables([tail, found])
            lost = [_losers(everyone, _newest(everyone, group, order))]
    return pa.concat_tables(lost), weighed


def _buckets_of(encoded: pa.Table, buckets: int) -> np.ndarray:
    """Each row's bucket of ``encoded`` (`_encoded`), by its key (`key_buckets`), hashed
    `_HASH_ROWS` at a time (the hash's temporaries grow with the key's width)."""
    canonical = encoded.select([n for n in encoded.column_names if n not in _NOT_KEYS])
    kind = np.uint8 if buckets <= 256 else np.uint16 if buckets <= 65_536 else np.int64
    out = np.empty(canonical.num_rows, dtype=kind)
    for start in range(0, canonical.num_rows, _HASH_ROWS):
        part = canonical.slice(start, _HASH_ROWS)
        out[start : start + part.num_rows] = key_buckets(part, buckets)
    return out


def _rivals(clean: Iterator[pa.Table], tail_keys: pa.Table, group: list[str]) -> Iterator[pa.Table]:
    """The records of ``clean`` whose (partition, key) is among ``tail_keys``'.

    The clean records are joined in chunks of at least ``tail_keys``' rows: a join builds
    its hash table of the tail's keys once a chunk, so the builds cost no more than one
    probe of the clean section, and a chunk's memory no more than the tail's.
    """
    chunk: list[pa.Table] = []
    rows = 0
    for table in clean:
        chunk.append(table)
        rows += table.num_rows
        if rows >= max(tail_keys.num_rows, MIN_JOIN_ROWS):
            yield pa.concat_tables(chunk).join(tail_keys, group, join_type="left semi")
            chunk, rows = [], 0
    if chunk:
        yield pa.concat_tables(chunk).join(tail_keys, group, join_type="left semi")


def _newest(records: pa.Table, group: list[str], order: str | None) -> pa.Table:
    """Each (partition, key)'s newest record of ``records``: its group columns and offset."""
    distinct, newest = latest_offsets(
        records.select(group), records.column(OFFSET), records.column(order) if order else None
    )
    return distinct.append_column(OFFSET, pa.array(newest, pa.int64()))


def _losers(records: pa.Table, winners: pa.Table) -> pa.Table:
    """(partition, offset) of the ``records`` that are not among ``winners``."""
    return records.select([PARTITION, OFFSET]).join(
        winners.select([PARTITION, OFFSET]),
        [PARTITION, OFFSET],
        join_type="left anti",
        use_threads=False,
    )


def _by_partition(lost: pa.Table) -> dict[int, np.ndarray]:
    partitions = lost.column(PARTITION).to_numpy(zero_copy_only=False)
    offsets = lost.column(OFFSET).to_numpy(zero_copy_only=False)
    distinct = np.unique(partitions) if len(partitions) else []
    if len(distinct) == 1:
        return {int(distinct[0]): np.sort(offsets)}
    # A record loses once: offsets are distinct within a partition (no repeats here).
    return {int(p): np.sort(offsets[partitions == p]) for p in distinct}


def _merged(sorted_parts: list[np.ndarray]) -> np.ndarray:
    """One partition's losers of every bucket, sorted (a key, so a record, is in one bucket)."""
    if len(sorted_parts) == 1:
        return sorted_parts[0]
    merged = np.concatenate(sorted_parts)
    merged.sort()
    return merged


def _encoded(table: pa.Table, keys: LogKeys, sequence: str | None) -> pa.Table:
    """(partition, canonical key columns, [sequence], offset) of ``table``'s records."""
    canonical = canonical_keys(table, own_keys(keys), every_validity=True)
    columns = {PARTITION: table.column(PARTITION).cast(pa.int64())}
    columns.update({name: canonical.column(name) for name in canonical.column_names})
    if sequence:
        columns[_SEQUENCE] = table.column(sequence)
    columns[OFFSET] = table.column(OFFSET).cast(pa.int64())
    return pa.table(columns)


def _concat(tables: list[pa.Table]) -> pa.Table | None:
    return pa.concat_tables(tables) if tables else None
