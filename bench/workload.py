"""Generated workloads: keyed updates with ~2% tombstones, uniform or Zipf-skewed over the keys.

Every batch is written once to a Parquet file (``key`` string, ``value``, null for
a tombstone, ``seq`` long: the record's global position) and every system reads
the same files, so input bytes are the sum of those files' sizes. Records come in
two sizes: ``35B`` (``value`` binary, 24 random bytes as hex: the original
workloads) and ``512B`` (``value`` a CDC-like struct of 10 columns, ~512 bytes a
record as Spark holds it: ids, amounts, codes from small vocabularies, free text).
Within a batch, file order is ``seq`` order, which is the order the sink assigns
offsets in; ``seq`` is what MERGE and the rewrite dedupe by.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

Skew = Literal["uniform", "zipf"]
RecordSize = Literal["35B", "512B"]

BATCH_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("seq", pa.int64())])
CDC_VALUE = pa.struct(
    [
        ("op", pa.string()),
        ("customer_id", pa.int64()),
        ("account", pa.string()),
        ("email", pa.string()),
        ("amount", pa.float64()),
        ("currency", pa.string()),
        ("status", pa.string()),
        ("address", pa.string()),
        ("notes", pa.string()),
        ("updated_ms", pa.int64()),
    ]
)
CDC_SCHEMA = pa.schema([("key", pa.string()), ("value", CDC_VALUE), ("seq", pa.int64())])
_STATUSES = np.array(["new", "active", "suspended", "closed", "pending_review"])
_CURRENCIES = np.array(["EUR", "USD", "GBP", "JPY", "CHF"])
_STREETS = np.array(
    [f"{n} Street, District {d}" for n in ("Oak", "Elm", "Main", "High") for d in range(8)]
)
VALUE_BYTES = 48  # 24 random bytes as hex: about the size of a small JSON document's payload
ZIPF_EXPONENT = 0.99  # YCSB's "zipfian" constant


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One workload: ``batches`` batches of ``records_per_batch`` updates over ``keys`` keys."""

    name: str
    keys: int
    batches: int
    records_per_batch: int
    skew: Skew = "uniform"
    tombstone_fraction: float = 0.02
    seed: int = 7
    record_size: RecordSize = "35B"
    systems: tuple[str, ...] | None = None  # None: every system the run asks for

    @property
    def schema(self) -> pa.Schema:
        return CDC_SCHEMA if self.record_size == "512B" else BATCH_SCHEMA

    @property
    def records(self) -> int:
        return self.batches * self.records_per_batch


def key_ids(rng: np.random.Generator, workload: Workload, count: int) -> np.ndarray:
    """Key ids in [0, keys): uniform, or bounded-Zipf ranks mapped through a fixed permutation.

    The permutation scatters the hot keys over the key space (and so over files),
    as a hash partitioner would.
    """
    if workload.skew == "uniform":
        return rng.integers(0, workload.keys, size=count)
    ranks = np.searchsorted(_zipf_cdf(workload.keys), rng.random(count), side="right")
    permutation = np.random.default_rng(workload.seed + 1).permutation(workload.keys)
    return permutation[np.minimum(ranks, workload.keys - 1)]


def _zipf_cdf(keys: int) -> np.ndarray:
    """The cumulative distribution of a Zipf law bounded to ``keys`` ranks (any exponent)."""
    weights = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** ZIPF_EXPONENT
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def batch_table(rng: np.random.Generator, workload: Workload, batch_id: int) -> pa.Table:
    """Batch ``batch_id`` of ``workload`` as an Arrow table in ``seq`` order."""
    n = workload.records_per_batch
    ids = key_ids(rng, workload, n)
    padded = pc.utf8_lpad(pa.array(ids).cast(pa.string()), width=8, padding="0")
    keys = pc.binary_join_element_wise("k", padded, "")
    if workload.record_size == "512B":
        return cdc_table(rng, workload, batch_id, ids, keys)
    raw = rng.integers(0, 256, size=(n, VALUE_BYTES // 2), dtype=np.uint8)
    hexed = np.char.encode(np.array([row.tobytes().hex() for row in raw]), "ascii").tolist()
    tombstone = rng.random(n) < workload.tombstone_fraction
    values = pa.array(hexed, pa.binary(), mask=tombstone)
    seq = pa.array(np.arange(batch_id * n, (batch_id + 1) * n, dtype=np.int64))
    return pa.Table.from_arrays([keys, values, seq], schema=BATCH_SCHEMA)


def _hex_strings(rng: np.random.Generator, n: int, chars: int) -> pa.Array:
    """``n`` random hex strings of ``chars`` characters each, built without a Python loop."""
    raw = rng.integers(0, 256, size=n * chars // 2, dtype=np.uint8).tobytes().hex().encode()
    offsets = pa.py_buffer(np.arange(0, n * chars + 1, chars, dtype=np.int32).tobytes())
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(raw))


def cdc_table(
    rng: np.random.Generator, workload: Workload, batch_id: int, ids: np.ndarray, keys: pa.Array
) -> pa.Table:
    """A CDC-like batch: the row image of a customer record after each change (~512 B).

    About half the bytes are random (hex ids, free text), the rest repeats (codes,
    vocabulary, amounts), so zstd shrinks it about as much as real change streams.
    """
    n = workload.records_per_batch
    first = batch_id * n
    text = pc.binary_join_element_wise(
        _hex_strings(rng, n, 192),
        pa.array(_STREETS[rng.integers(0, len(_STREETS), n)]),
        _hex_strings(rng, n, 64),
        pa.array(np.repeat("; note: ", n)),
    )
    value = pa.StructArray.from_arrays(
        [
            _contiguous(field)
            for field in (
                pa.array(np.where(rng.random(n) < 0.1, "c", "u")),
                pa.array(ids.astype(np.int64)),
                _hex_strings(rng, n, 32),
                pc.binary_join_element_wise(
                    _hex_strings(rng, n, 16), pa.array(np.repeat("@example.com", n)), ""
                ),
                pa.array(np.round(rng.gamma(2.0, 50.0, n), 2)),
                pa.array(_CURRENCIES[rng.integers(0, len(_CURRENCIES), n)]),
                pa.array(_STATUSES[rng.integers(0, len(_STATUSES), n)]),
                pc.binary_join_element_wise(
                    pa.array(rng.integers(1, 999, n).astype(str)),
                    pa.array(_STREETS[rng.integers(0, len(_STREETS), n)]),
                    _hex_strings(rng, n, 24),
                    " ",
                ),
                text,
                pa.array(1_700_000_000_000 + np.arange(first, first + n, dtype=np.int64) * 7),
            )
        ],
        fields=list(CDC_VALUE),
        mask=pa.array(rng.random(n) < workload.tombstone_fraction),
    )
    seq = pa.array(np.arange(first, first + n, dtype=np.int64))
    return pa.Table.from_arrays([keys, value, seq], schema=CDC_SCHEMA)


def _contiguous(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    # Compute kernels may return a chunked result for large inputs; a struct needs arrays.
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def generate(workload: Workload, directory: str) -> list[str]:
    """Write every batch of ``workload`` under ``directory``; returns the files in batch order.

    Deterministic for a given seed; files already present are reused.
    """
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(workload.seed)
    paths = []
    for batch_id in range(workload.batches):
        table = batch_table(rng, workload, batch_id)
        path = os.path.join(directory, f"batch-{batch_id:05d}.parquet")
        if not os.path.exists(path):
            pq.write_table(table, path, compression="zstd")
        paths.append(path)
    return paths
