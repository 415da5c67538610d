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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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


def canonical_keys(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The key ``columns`` of ``table`` as flat, null-free columns ``k0, k1, ...``.

    Two rows have equal encodings exactly when Spark would group their keys together.
    Pure; the row order is kept.
    """
    arrays: list[pa.Array] = []
    for name in columns:
        arrays.extend(_encode(_one_chunk(table.column(name))))
    return pa.Table.from_arrays(arrays, names=[f"k{i}" for i in range(len(arrays))])


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    return pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)


def _encode(array: pa.Array) -> list[pa.Array]:
    kind = array.type
    if pa.types.is_struct(kind):
        out = [_validity(array)]
        for child in array.flatten():  # a child is null where its struct is
            out.extend(_encode(child))
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
        return [array]
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
