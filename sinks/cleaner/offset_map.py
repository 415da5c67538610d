"""Kafka's offset map: the latest offset of each key of one partition's dirty section, exact.

Kafka's ``Cleaner.buildOffsetMap`` reads the dirty section (from the first dirty
offset on) segment by segment into a map bounded by ``log.cleaner.dedupe.buffer.size``
and records, per key, the offset of its latest record; when the map is full it
stops, and the pass ends at the first offset the map does not cover (the rest stays
dirty for the next pass, KAFKA-3894). The recopy then keeps a record unless the map
holds a newer offset for its key. Here the map is exact (keys compared by value
through `sinks.cleaner.key_encoding`, never through a digest: Kafka's
``SkimpyOffsetMap`` loses a key to an MD5 collision), held as Arrow columns, and
built inside the Spark task that recopies the partition, never on the driver.

Why the dirty section suffices: the clean section (segments wholly below the
cleaner offset the log records, see `sinks.reading.state_reader`) holds at most one
record per key, below every dirty offset. So a clean record is obsolete exactly when
the map holds its key, and a mapped record exactly when its offset is not its key's
newest. With a ``sequence_column`` a clean record may beat a dirty one: the map then
covers the whole cleanable range (`map_segments`), and every record is kept exactly
when it is its key's newest.

The bound: the driver cannot count keys without reading them, so it bounds records
(a segment's record count is in the Delta log, and records >= keys), choosing the
pass's end offset at a segment boundary so that a partition's mapped records fit
(`map_end_offset`): Kafka's approach, bounding by map slots segment by segment.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sinks.cleaner.key_encoding import canonical_keys
from sinks.cleaner.rules import latest_offsets
from sinks.log.segment import Segment, split_clean

# What one mapped record costs a task at its peak, measured: 146 bytes a record for
# 16-byte string keys (2.5 M records, 1.25 M keys; a fresh process's peak RSS growth
# while it reads the narrow columns of one Parquet file and builds the map; 105 bytes
# a record stay held). Rounded up; wider keys cost more.
BYTES_PER_MAPPED_RECORD = 160


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


def map_segments(
    inputs: Sequence[Segment],
    *,
    first_dirty_offset: int,
    cleaner_offset: int | None,
    sequence_column: str | None,
) -> list[Segment]:
    """The input segments a partition's map is built from: the dirty ones, or every input
    segment with a sequence column (a clean record may then beat a dirty one). Pure."""
    if sequence_column is not None:
        return list(inputs)
    return dirty_segments(
        inputs, first_dirty_offset=first_dirty_offset, cleaner_offset=cleaner_offset
    )


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

    Built from the mapped records' key columns, offsets and (optionally) sequence
    values; probed file by file during the recopy. Holds the distinct canonical keys and
    their newest offsets, sorted, nothing else.
    """

    def __init__(
        self,
        keys: pa.Table,
        offsets: pa.ChunkedArray,
        sequence: pa.ChunkedArray | None = None,
    ) -> None:
        distinct, newest = latest_offsets(
            canonical_keys(keys, keys.column_names), offsets, sequence
        )
        self._keys = distinct
        self._newest = np.sort(newest)

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
        probe = canonical_keys(keys, keys.column_names)
        if not self.size:
            return np.ones(probe.num_rows, dtype=bool)
        rows = probe.append_column("_row", pa.array(np.arange(probe.num_rows, dtype=np.int64)))
        absent = rows.join(self._keys, probe.column_names, join_type="left anti")
        mask = np.zeros(probe.num_rows, dtype=bool)
        mask[absent.column("_row").to_numpy()] = True
        return mask
