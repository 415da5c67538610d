"""Kafka's offset map: the latest offset of each key of one partition's dirty section, exact.

`size_map` chooses, per partition, the map that fits ``log.cleaner.dedupe.buffer.size``:
built at once, in hash buckets of keys (`key_buckets`), or cut where it fills
(`map_end_offset`); `OffsetMap` is the map; `canonical_keys` encodes key columns so that
Arrow compares them as Spark's grouping does. Why the dirty section suffices, the three
maps and the key encoding rules: design.md §42.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.log.latest import latest_offsets
from sinks.log.log_keys import LogKeys
from sinks.log.segment import Segment, split_clean

# What one mapped record costs a task at its peak while its map (or bucket) is built;
# measured with distinct 16-byte string keys (docs/benchmarks.md). Wider keys cost more.
BYTES_PER_MAPPED_RECORD = 256
# What a mapped key costs once built when only its newest offset is held (a bucketed map).
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
    keys: LogKeys,
    end_offset: int,
    dedupe_buffer_size: int,
) -> MapSize:
    """The map a partition's pass builds within ``dedupe_buffer_size``, and where the pass
    ends (see the module's three options). Pure.

    ``inputs`` are the partition's input segments below ``end_offset``, the first
    uncleanable offset. With ``keys``' sequence column the clean section is mapped too.
    """
    sequence_column = keys.sequence_column
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


# Types whose values Arrow's hash tables compare exactly as Spark groups them.
_AS_IS = (
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def canonical_keys(
    table: pa.Table, columns: Sequence[str], *, every_validity: bool = False
) -> pa.Table:
    """The key ``columns`` of ``table`` as flat, null-free columns ``k0, k1, ...``.

    Two rows have equal encodings exactly when Spark would group their keys together.
    A leaf without nulls has no validity flag, unless ``every_validity``: then the
    columns depend on the key's type only, so encodings of separate chunks line up.
    Pure; the row order is kept.
    """
    arrays: list[pa.Array] = []
    for name in columns:
        arrays.extend(_encode(_one_chunk(table.column(name)), every_validity))
    return pa.Table.from_arrays(arrays, names=[f"k{i}" for i in range(len(arrays))])


def key_buckets(canonical: pa.Table, buckets: int) -> np.ndarray:
    """Each row's bucket in ``range(buckets)``, from a hash of its canonical key. Pure.

    Deterministic across processes and runs (no per-process seed), so every scan of a
    partition puts a key in the same bucket.
    """
    if buckets <= 1:
        return np.zeros(canonical.num_rows, dtype=np.int64)
    combined = np.zeros(canonical.num_rows, dtype=np.uint64)
    for column in canonical.columns:
        combined = combined * _GOLDEN + _column_hash(_one_chunk(column))
    return (_mix(combined) % np.uint64(buckets)).astype(np.int64)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BYTE_BASE = np.uint64(0x100000001B3)


def _column_hash(array: pa.Array) -> np.ndarray:
    """A 64-bit hash per value of one null-free canonical column (see `canonical_keys`)."""
    kind = array.type
    if pa.types.is_boolean(kind):
        return array.cast(pa.uint8()).to_numpy(zero_copy_only=False).astype(np.uint64)
    if pa.types.is_integer(kind):
        return array.cast(pa.int64()).to_numpy(zero_copy_only=False).view(np.uint64)
    return _bytes_hash(array)


def _bytes_hash(array: pa.Array) -> np.ndarray:
    """A polynomial hash of each string or binary value's bytes, mixed with its length."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    _, offsets_buffer, data_buffer = array.buffers()
    width = np.int64 if large else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[
        array.offset : array.offset + len(array) + 1
    ]
    offsets = offsets.astype(np.int64)
    first = int(offsets[0]) if len(offsets) else 0
    lengths = np.diff(offsets)
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[first : int(offsets[-1])]
        if data_buffer is not None and len(offsets)
        else np.zeros(0, dtype=np.uint8)
    )
    if len(lengths) and lengths.min() == lengths.max():  # keys of one length: row-wise
        width = int(lengths[0])
        powers = np.cumprod(np.full(width, _BYTE_BASE, dtype=np.uint64))
        with np.errstate(over="ignore"):
            rows = data.reshape(len(lengths), width).astype(np.uint64) * powers
            return rows.sum(axis=1, dtype=np.uint64) + lengths.astype(np.uint64)
    position = np.arange(len(data), dtype=np.int64) - np.repeat(offsets[:-1] - first, lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=0)) + 1, _BYTE_BASE, dtype=np.uint64))
    with np.errstate(over="ignore"):
        weighted = data.astype(np.uint64) * powers[position]
        sums = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(weighted, dtype=np.uint64)])
        return sums[offsets[1:] - first] - sums[offsets[:-1] - first] + lengths.astype(np.uint64)


def _mix(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    return pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)


def _encode(array: pa.Array, every_validity: bool) -> list[pa.Array]:
    kind = array.type
    if pa.types.is_struct(kind):
        out = [_validity(array)]
        for child in array.flatten():  # a child is null where its struct is
            out.extend(_encode(child, every_validity))
        return out
    if pa.types.is_floating(kind):
        array = _float_bits(array)
    elif (
        pa.types.is_timestamp(kind)
        or pa.types.is_time(kind)
        or pa.types.is_duration(kind)
        or pa.types.is_date(kind)
    ):
        array = array.view(pa.int64() if kind.bit_width == 64 else pa.int32())
    elif pa.types.is_decimal(kind):
        array = array.cast(pa.string())
    elif not any(compares_as_is(kind) for compares_as_is in _AS_IS):
        array = pa.array([None if v is None else repr(_py(v)) for v in array.to_pylist()])
    if array.null_count == 0:
        return [_validity(array), array] if every_validity else [array]
    return [_validity(array), pc.fill_null(array, _zero(array.type))]


def _float_bits(array: pa.Array) -> pa.Array:
    """One NaN, no ``-0.0`` (``x + 0.0`` turns it into ``0.0``), then the bits as an int."""
    width = array.type.bit_width
    if width == 16:
        array, width = array.cast(pa.float32()), 32
    nan = pa.scalar(math.nan, array.type)
    normal = pc.if_else(pc.is_nan(array), nan, pc.add(array, pa.scalar(0.0, array.type)))
    return normal.view(pa.int64() if width == 64 else pa.int32())


def _validity(array: pa.Array) -> pa.Array:
    return pc.is_valid(array)


def _zero(kind: pa.DataType) -> Any:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.scalar(b"", kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(False, kind)
    return pa.scalar(0, pa.int64()).cast(kind)


def _py(value: Any) -> Any:
    """A Python value with the float rules applied, for the row-by-row fallback."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    if isinstance(value, dict):
        return tuple((k, _py(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_py(v) for v in value)
    return value
