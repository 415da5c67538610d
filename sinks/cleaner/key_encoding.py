"""Keys as Spark groups them: a canonical encoding of key columns for Arrow's hash tables.

Kafka's offset map hashes a key's bytes (``SkimpyOffsetMap``: MD5, so two keys may
collide and one is lost). Here a key is compared by value, exactly as Spark's
``groupBy`` compares it, by encoding each key column into flat, null-free Arrow
columns whose equality is Spark's equality. Arrow's hash aggregate and hash join
then group and match keys exactly; no key is ever lost to a hash collision.

The rules (``canonical_keys``), each what Spark's ``NormalizeFloatingNumbers`` and
its grouping do:

- integers, booleans, strings, binaries: their value, unchanged;
- floats and doubles: every NaN is one NaN and ``-0.0`` is ``0.0`` (Spark groups
  them so), then the IEEE bits as an integer, so equality is bit equality;
- timestamps, dates, times, durations: their integer count of the column's unit (a
  timestamp's zone is metadata: the stored instant is UTC in both engines);
- decimals: their text at the column's fixed scale (one text per value);
- structs: a validity flag, then each field's encoding, depth first (a null
  struct and a struct of null fields differ, as in Spark);
- lists and anything else Spark can group on: a text rendering of the value
  after the same float rules, row by row in Python (slow, and rare as a key).

Every nullable leaf becomes two columns, a validity flag and the value with nulls
filled by a constant, since Arrow's hash join never matches a null while Spark's
grouping puts nulls together.

``key_buckets`` spreads canonical keys over a number of buckets by a hash of the
encoding (equal keys always share a bucket), so that an offset map too large to build
at once is built a bucket at a time. The hash only balances the buckets: keys are
still compared by value within each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
