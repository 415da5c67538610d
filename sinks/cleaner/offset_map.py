"""Kafka's offset map: the latest offset of each key of one partition's dirty section, exact.

Kafka's ``Cleaner.buildOffsetMap`` reads the dirty section (from the first dirty
offset on) segment by segment into a map bounded by ``log.cleaner.dedupe.buffer.size``
and records, per key, the offset of its latest record; when the map is full it
stops, and the pass ends at the first offset the map does not cover (the rest stays
dirty for the next pass, KAFKA-3894). The recopy then keeps a record unless the map
holds a newer offset for its key. Here the map is exact (keys compared by value
through `sinks.cleaner.key_encoding`, never through a digest: Kafka's
``SkimpyOffsetMap`` loses a key to an MD5 collision), held as the sorted newest
offsets (plus the distinct keys while a clean file is probed by key), and built
inside the Spark task that recopies the partition, never on the driver.

Why the dirty section suffices: the clean section (segments wholly below the
cleaner offset the log records, see `sinks.reading.state_reader`) holds at most one
record per key, below every dirty offset. So a clean record is obsolete exactly when
the map holds its key, and a mapped record exactly when its offset is not its key's
newest. With a ``sequence_column`` a clean record may beat a dirty one: the map then
covers the whole cleanable range (`size_map`), and every record is kept exactly
when it is its key's newest.

The bound: the driver cannot count keys without reading them, so it bounds records
(a segment's record count is in the Delta log, and records >= keys). `size_map` chooses,
per partition, the cheapest map that fits ``log.cleaner.dedupe.buffer.size``:

1. the dirty section's keys and newest offsets, built at once, when its records fit
   (``BYTES_PER_MAPPED_RECORD`` each while the map is built);
2. otherwise every input record's newest offset only (8 bytes a key held), built in
   hash buckets of keys (`sinks.cleaner.key_encoding.key_buckets`), one bucket at a
   time, each bucket's build within the buffer. Each row's bucket is hashed in the
   first scan and kept (a byte a record); a later scan only reads and filters the
   narrow columns (0.5 s per 7.5 M records here): 7.5 M records of 3.75 M keys map in
   3.8 s in 4 buckets, peak 467 MiB, against 3.6 s and 1,083 MiB at once. Every input
   file is then mapped, so no clean file is probed by key;
3. when even ``MAX_MAP_BUCKETS`` buckets do not fit: Kafka's bound, the pass ending at
   the first segment the map cannot take (`map_end_offset`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sinks.cleaner.key_encoding import canonical_keys
from sinks.cleaner.rules import latest_offsets
from sinks.log.segment import Segment, split_clean

# What one mapped record costs a task at its peak while its map (or bucket) is built,
# measured with 16-byte string keys, every key distinct (the worst case for a bound on
# records): 222 bytes a record (a fresh process's peak RSS growth between 1.25 M and
# 3.75 M distinct keys, read from Parquet row group by row group: 375 and 905 MiB; about
# 110 MiB of it is fixed, the reader and Arrow's pool). With every key written twice a
# record costs 151 bytes. Rounded up; wider keys cost more.
BYTES_PER_MAPPED_RECORD = 256
# What a mapped key costs once built when only its newest offset is held (option 2).
BYTES_PER_NEWEST_OFFSET = 8
# The most scans of a partition's narrow columns a bucketed map may take.
MAX_MAP_BUCKETS = 8


def max_map_records(dedupe_buffer_size: int) -> int:
    """How many records a task may map within ``dedupe_buffer_size`` bytes (at least one)."""
    return max(1, dedupe_buffer_size // BYTES_PER_MAPPED_RECORD)


def dirty_segments(
    segments: Sequence[Segment], *, first_dirty_offset: int, cleaner_offset: int | None
) -> list[Segment]:
    """The segments of one partition that the map must cover. Pure.

    A segment is clean only when it lies wholly below both the first dirty offset
    and the cleaner offset the log itself records (what guarantees one record per
    key); every other segment, including one straddling either, is dirty.
    """
    end = min(first_dirty_offset, cleaner_offset) if cleaner_offset is not None else None
    return split_clean(segments, end)[1]


def map_buckets(records: int, dedupe_buffer_size: int) -> int | None:
    """How many buckets a map of ``records`` newest offsets is built in so that each
    bucket's build plus the offsets already held fit ``dedupe_buffer_size``; None when
    more than ``MAX_MAP_BUCKETS`` would be needed. Pure."""
    spare = dedupe_buffer_size - records * BYTES_PER_NEWEST_OFFSET
    if spare <= 0:
        return None
    buckets = max(1, -(-records * BYTES_PER_MAPPED_RECORD // spare))
    return buckets if buckets <= MAX_MAP_BUCKETS else None


def max_bucketed_records(dedupe_buffer_size: int) -> int:
    """The most records a map built in ``MAX_MAP_BUCKETS`` buckets may cover (at least one)."""
    per_record = BYTES_PER_MAPPED_RECORD / MAX_MAP_BUCKETS + BYTES_PER_NEWEST_OFFSET
    return max(1, int(dedupe_buffer_size / per_record))


@dataclass(frozen=True)
class MapSize:
    """One partition's map as `size_map` chose it: the segments it covers, where the pass
    ends (``end_offset``), in how many buckets it is built (1: keys held too), and whether
    it fits the buffer (not when Kafka's bound had to take one segment larger than it)."""

    mapped: tuple[Segment, ...]
    end_offset: int
    buckets: int
    fits: bool = True


def size_map(
    inputs: Sequence[Segment],
    *,
    first_dirty_offset: int,
    cleaner_offset: int | None,
    sequence_column: str | None,
    end_offset: int,
    dedupe_buffer_size: int,
) -> MapSize:
    """The map a partition's pass builds within ``dedupe_buffer_size``, and where the pass
    ends (see the module's three options). Pure.

    ``inputs`` are the partition's input segments below ``end_offset``, the first
    uncleanable offset.
    """
    dirty = dirty_segments(
        inputs, first_dirty_offset=first_dirty_offset, cleaner_offset=cleaner_offset
    )
    at_once = max_map_records(dedupe_buffer_size)
    if sequence_column is None and _records(dirty) <= at_once:
        return MapSize(tuple(dirty), end_offset, 1)
    buckets = map_buckets(_records(inputs), dedupe_buffer_size)
    if buckets is not None:
        return MapSize(tuple(inputs), end_offset, buckets)
    if sequence_column is None:
        mapped, bound = dirty, at_once
    else:  # the clean section must be mapped too
        mapped, bound = list(inputs), max_bucketed_records(dedupe_buffer_size)
    end = map_end_offset(mapped, bound, end_offset, first_dirty_offset=first_dirty_offset)
    taken = tuple(s for s in mapped if s.last_offset < end)
    if sequence_column is None:
        return MapSize(taken, end, 1, fits=_records(taken) <= at_once)
    buckets = map_buckets(_records(taken), dedupe_buffer_size)
    return MapSize(taken, end, buckets or MAX_MAP_BUCKETS, fits=buckets is not None)


def _records(segments: Sequence[Segment]) -> int:
    return sum(s.num_records for s in segments)


def map_end_offset(
    mapped: Sequence[Segment], max_records: int, end_offset: int, *, first_dirty_offset: int
) -> int:
    """Where a partition's pass ends so that its map fits ``max_records``. Pure.

    ``mapped`` are the segments the map would cover, in offset order, and ``end_offset``
    where the pass would end unbounded. Dirty segments are taken in order while their
    records fit; the pass then ends at the base offset of the first that does not, the
    first offset the map does not cover. The first dirty segment is always taken (a
    segment larger than the buffer is mapped whole, so every pass makes progress; Kafka
    refuses such a segment instead), as are the clean segments a sequence column maps.
    """
    used = 0
    dirty_taken = False
    for segment in mapped:
        dirty = segment.last_offset >= first_dirty_offset
        if dirty and dirty_taken and used + segment.num_records > max_records:
            return segment.base_offset
        used += segment.num_records
        dirty_taken = dirty_taken or dirty
    return end_offset


class OffsetMap:
    """The exact offset map of one partition: each key's newest offset among the mapped records.

    Holds the newest offsets, sorted, and (only when clean files are probed by key,
    ``lacks``) the distinct canonical keys; probed file by file during the recopy.
    """

    def __init__(self, newest: np.ndarray, keys: pa.Table | None = None) -> None:
        self._newest = np.sort(newest)
        self._keys = keys

    @classmethod
    def build(
        cls,
        keys: pa.Table,
        offsets: pa.ChunkedArray,
        sequence: pa.ChunkedArray | None = None,
        *,
        keep_keys: bool = True,
    ) -> OffsetMap:
        """The map of these records; ``keys`` canonical already (`canonical_keys`, with
        ``every_validity``, as ``lacks`` encodes its probes)."""
        distinct, newest = latest_offsets(keys, offsets, sequence)
        return cls(newest, distinct if keep_keys else None)

    @property
    def newest(self) -> np.ndarray:
        """The newest offsets the map holds, sorted."""
        return self._newest

    @property
    def size(self) -> int:
        """How many keys the map holds."""
        return len(self._newest)

    def is_newest(self, offsets: np.ndarray) -> np.ndarray:
        """Per record of the mapped range: whether its offset is its key's newest."""
        if not len(self._newest):
            return np.zeros(len(offsets), dtype=bool)
        at = np.searchsorted(self._newest, offsets)
        at[at == len(self._newest)] = 0
        return self._newest[at] == offsets

    def lacks(self, keys: pa.Table) -> np.ndarray:
        """Per record (by key): whether the map holds no offset for its key."""
        if self._keys is None:
            raise ValueError("this map holds no keys: every input file was mapped")
        probe = canonical_keys(keys, keys.column_names, every_validity=True)
        if not self.size:
            return np.ones(probe.num_rows, dtype=bool)
        rows = probe.append_column("_row", pa.array(np.arange(probe.num_rows, dtype=np.int64)))
        absent = rows.join(self._keys, probe.column_names, join_type="left anti")
        mask = np.zeros(probe.num_rows, dtype=bool)
        mask[absent.column("_row").to_numpy()] = True
        return mask
