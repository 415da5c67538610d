"""The key filter of a segment: Parquet's own bloom filter on the key columns (design.md §38).

Kafka finds a key's record through the offset index of each segment; a compacted log on
Delta keeps its segments in offset order, so a key may sit in any file and min/max
statistics of the key column prune nothing. Each row group a writer of this log writes
(the Python task, Spark's writer, a pass, a restore) carries a Parquet split-block bloom filter
(SBBF, parquet-format's BloomFilter.md) on each key column, in the file itself: it
travels with the file and goes with it when the file is deleted. A lookup probes it to
skip the row groups that cannot hold a key.

Invariant: a row group is skipped only when a key column's filter, read from the file,
proves that none of the wanted values is there. A row group without a filter (another
engine's OPTIMIZE, a file written before filters existed), with a filter this module does
not understand, or with a column of a type it does not hash, is read whole.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sinks.log import thrift_compact as thrift
from sinks.log.parquet_thrift import UNION_FIRST, BloomFilterHeader

# False-positive rate of each filter: about 10 bits a distinct key, which the writers
# round up to a power of two (2 bytes a key in a full row group of 131,072): at most one
# row group in a hundred read in vain per key.
KEY_FILTER_FPP = 0.01
# Spark's writer (parquet-mr), when a file's row count is not known beforehand, keeps
# candidate filters of 1 MiB (its cap), 512 KiB, ... down to 8 KiB while it writes a row
# group, and writes the smallest that holds the distinct keys it saw at this rate (its
# "adaptive" filter): a small file gets a small one, at the cost of hashing every key
# into each candidate still open (design.md §38).
SPARK_KEY_FILTER_CANDIDATES = 8
# Set (to anything) in a writer's environment, the Python segment writer writes no key
# filter: not a setting, only for measuring what the filter costs a pass.
KEY_FILTER_OFF_ENV = "_COMPACTED_SINK_NO_KEY_FILTER"

# The page index and the page sizes each file is written with, so that a lookup reads, of
# the columns other than the key, only the pages holding a matched row (design.md §38):
# pages of about 16 KiB (256 values at most between size checks, so long values still
# make small pages), and dictionary pages of at most 64 KiB (a column of distinct values,
# as offsets and most values are, turns plain early instead of keeping a 1 MiB dictionary
# every read of a page must decode first).
PAGE_BYTES = 16 * 1024
DICTIONARY_PAGE_BYTES = 64 * 1024
PAGE_WRITE_BATCH = 256
# Set (to anything) in a writer's environment, the Python segment writer writes neither
# the page index nor small pages: not a setting, only for measuring what they cost.
PAGE_INDEX_OFF_ENV = "_COMPACTED_SINK_NO_PAGE_INDEX"

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_M64 = (1 << 64) - 1
_SALT = np.array(
    [
        0x47B6137B,
        0x44974D91,
        0x8824AD5B,
        0xA2B7289D,
        0x705495C7,
        0x2DF1424B,
        0x9EFC4947,
        0x5C6BFB31,
    ],
    dtype=np.uint64,
)
_BLOCK_BYTES = 32


def filtered_columns(schema: pa.Schema, columns: Sequence[str]) -> list[str]:
    """The columns of ``columns`` that get a key filter: those of ``schema`` whose type a
    lookup hashes (strings, binaries, integers). Pure."""
    return [c for c in columns if c in schema.names and _hashed(schema.field(c).type)]


def _hashed(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_integer(arrow_type)
    )


def key_filter_options(
    schema: pa.Schema, columns: Sequence[str], rows: int
) -> dict[str, dict[str, Any]]:
    """pyarrow's ``bloom_filter_options`` for a key filter on ``columns`` (those
    `filtered_columns` keeps), sized for row groups of ``rows`` distinct keys at most. Pure."""
    ndv = max(int(rows), 1)
    return {c: {"ndv": ndv, "fpp": KEY_FILTER_FPP} for c in filtered_columns(schema, columns)}


@functools.cache
def pyarrow_writes_key_filters() -> bool:
    """Whether this pyarrow's Parquet writer takes ``bloom_filter_options`` (pyarrow 24 and
    later). Before it, the Python writer writes files without a key filter, which a lookup
    reads whole (design.md §38). Probed once, by opening a writer in memory."""
    schema = pa.schema([("k", pa.string())])
    options = {"k": {"ndv": 1, "fpp": KEY_FILTER_FPP}}
    try:
        pq.ParquetWriter(pa.BufferOutputStream(), schema, bloom_filter_options=options).close()
    except TypeError:
        return False
    return True


def page_index_options() -> dict[str, Any]:
    """pyarrow ``ParquetWriter`` options for the page index and the page sizes a lookup
    reads pages with (`PAGE_BYTES`, `DICTIONARY_PAGE_BYTES`); none when `PAGE_INDEX_OFF_ENV`
    is set. Reads the environment only."""
    if os.environ.get(PAGE_INDEX_OFF_ENV):
        return {}
    return {
        "write_page_index": True,
        "data_page_size": PAGE_BYTES,
        "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
        "write_batch_size": PAGE_WRITE_BATCH,
    }


def spark_key_filter_options(
    schema: pa.Schema, columns: Sequence[str], rows_per_file: int | None = None
) -> dict[str, str]:
    """The Parquet writer options that make Spark's writer (parquet-mr) write the same
    filter on ``columns`` (those `filtered_columns` keeps): sized for ``rows_per_file``
    distinct keys when the caller knows how many rows a file gets at most, otherwise
    parquet-mr's adaptive filter, sized by the keys each row group holds. Pure."""
    filtered = filtered_columns(schema, columns)
    if not filtered:
        return {}
    options = {}
    if rows_per_file is None:
        options["parquet.bloom.filter.adaptive.enabled"] = "true"
    for c in filtered:
        options[f"parquet.bloom.filter.enabled#{c}"] = "true"
        options[f"parquet.bloom.filter.fpp#{c}"] = str(KEY_FILTER_FPP)
        if rows_per_file is None:
            options[f"parquet.bloom.filter.candidates.number#{c}"] = str(
                SPARK_KEY_FILTER_CANDIDATES
            )
        else:
            options[f"parquet.bloom.filter.expected.ndv#{c}"] = str(max(int(rows_per_file), 1))
    return options


def xxhash64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data``: the hash Parquet's bloom filters use (with seed 0). Pure."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M64
        v2 = (seed + _P2) & _M64
        v3 = seed & _M64
        v4 = (seed - _P1) & _M64
        while i + 32 <= n:
            a, b, c, d = struct.unpack_from("<QQQQ", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        for v in (v1, v2, v3, v4):
            h = ((h ^ _round(0, v)) * _P1 + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, i)
        h = (_rotl(h ^ ((lane * _P1) & _M64), 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M64), 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def xxhash64_many(values: Sequence[bytes]) -> np.ndarray:
    """`xxhash64` of each of ``values`` (seed 0) as uint64, computed with numpy for all
    values of a length at once: no Python work per value but the grouping. Pure."""
    out = np.empty(len(values), dtype=np.uint64)
    by_length: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        by_length.setdefault(len(v), []).append(i)
    for n, where in by_length.items():
        data = np.frombuffer(b"".join(values[i] for i in where), dtype=np.uint8)
        out[where] = _xxhash64_rows(data.reshape(len(where), n))
    return out


def _xxhash64_rows(data: np.ndarray) -> np.ndarray:
    """`xxhash64` of each row of ``data`` (uint8, one value of ``data.shape[1]`` bytes a row)."""
    u = np.uint64
    m, n = data.shape

    def lane(i: int, width: int) -> np.ndarray:
        words = np.ascontiguousarray(data[:, i : i + width]).view(f"<u{width}")
        return words.reshape(m).astype(u)

    def rotl(x: np.ndarray, r: int) -> np.ndarray:
        return (x << u(r)) | (x >> u(64 - r))

    def round_(acc: np.ndarray, value: np.ndarray) -> np.ndarray:
        return rotl(acc + value * u(_P2), 31) * u(_P1)

    with np.errstate(over="ignore"):
        i = 0
        if n >= 32:
            v = [
                np.full(m, (_P1 + _P2) & _M64, u),
                np.full(m, _P2, u),
                np.zeros(m, u),
                np.full(m, (-_P1) & _M64, u),
            ]
            while i + 32 <= n:
                v = [round_(v[k], lane(i + 8 * k, 8)) for k in range(4)]
                i += 32
            h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)
            for acc in v:
                h = (h ^ round_(np.zeros(m, u), acc)) * u(_P1) + u(_P4)
        else:
            h = np.full(m, _P5, u)
        h = h + u(n)
        while i + 8 <= n:
            h = rotl(h ^ round_(np.zeros(m, u), lane(i, 8)), 27) * u(_P1) + u(_P4)
            i += 8
        if i + 4 <= n:
            h = rotl(h ^ (lane(i, 4) * u(_P1)), 23) * u(_P2) + u(_P3)
            i += 4
        while i < n:
            h = rotl(h ^ (data[:, i].astype(u) * u(_P5)), 11) * u(_P1)
            i += 1
        h = (h ^ (h >> u(33))) * u(_P2)
        h = (h ^ (h >> u(29))) * u(_P3)
        return h ^ (h >> u(32))


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def key_hashes(values: pa.Array, physical_type: str) -> np.ndarray | None:
    """The filter hashes (uint64) of ``values`` as a column chunk of ``physical_type``
    stores them (Parquet's plain encoding), or None when this module does not hash that
    column (the row group is then read). A value that the chunk's type cannot hold gets a
    hash anyway: a false "maybe" only costs a read. Pure."""
    arrow_type = values.type
    if not _hashed(arrow_type):
        return None
    if physical_type == "BYTE_ARRAY" and not pa.types.is_integer(arrow_type):
        encoded = [v.encode() if isinstance(v, str) else v for v in values.to_pylist()]
    elif physical_type in ("INT32", "INT64") and pa.types.is_integer(arrow_type):
        fmt = "<i" if physical_type == "INT32" else "<q"
        bits = 32 if physical_type == "INT32" else 64
        encoded = []
        for v in values.to_pylist():
            if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
                # Unsigned types are stored reinterpreted; a value out of range is never
                # in the chunk, but hashing its reinterpretation is always safe.
                v = ((v + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
            encoded.append(struct.pack(fmt, v))
    else:
        return None
    return xxhash64_many(encoded)


def parse_filter_header(head: bytes) -> tuple[int, int] | None:
    """(header length, bitset length) of the BloomFilterHeader at the start of ``head``, or
    None when it is not a split-block, xxHash, uncompressed filter (then nothing is skipped
    with it). Pure."""
    try:
        reader = thrift.Reader(head)
        fields = {k: value for k, (_, value) in reader.struct().items()}
    except (IndexError, ValueError):
        return None
    num_bytes = fields.get(BloomFilterHeader.NUM_BYTES)
    first_member = {UNION_FIRST: (thrift.STRUCT, {})}  # split-block, xxHash, uncompressed
    unions = (BloomFilterHeader.ALGORITHM, BloomFilterHeader.HASH, BloomFilterHeader.COMPRESSION)
    known = all(fields.get(f) == first_member for f in unions)
    if not isinstance(num_bytes, int) or not known or num_bytes <= 0 or num_bytes % _BLOCK_BYTES:
        return None
    return reader.pos, num_bytes


def block_indexes(hashes: np.ndarray, bitset_bytes: int) -> np.ndarray:
    """The block each hash falls in, for a bitset of ``bitset_bytes``. Pure."""
    blocks = np.uint64(bitset_bytes // _BLOCK_BYTES)
    return (((hashes >> np.uint64(32)) * blocks) >> np.uint64(32)).astype(np.int64)


def blocks_contain(blocks: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Per hash: whether its block (``blocks``, one 8-word row per hash) may hold it. Pure."""
    return _in_blocks(blocks, hashes)


def _in_blocks(blocks: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    key = (hashes & np.uint64(0xFFFFFFFF))[:, None]
    bits = ((key * _SALT[None, :]) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
    mask = np.left_shift(np.uint64(1), bits)
    return np.all((blocks.astype(np.uint64) & mask) != 0, axis=1)
