"""Generated workloads: keyed updates with ~2% tombstones, uniform or Zipf-skewed over the keys.

Every batch is written once to a Parquet file (``key`` string, ``value`` binary,
null for a tombstone, ``seq`` long: the record's global position) and every
system reads the same files, so input bytes are the sum of those files' sizes.
Within a batch, file order is ``seq`` order, which is the order the sink assigns
offsets in; ``seq`` is what MERGE and the rewrite dedupe by.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

Skew = Literal["uniform", "zipf"]

BATCH_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("seq", pa.int64())])
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
    keys = pa.array(np.char.add("k", np.char.zfill(ids.astype(str), 8)).tolist(), pa.string())
    raw = rng.integers(0, 256, size=(n, VALUE_BYTES // 2), dtype=np.uint8)
    hexed = np.char.encode(np.array([row.tobytes().hex() for row in raw]), "ascii").tolist()
    tombstone = rng.random(n) < workload.tombstone_fraction
    values = pa.array(hexed, pa.binary(), mask=tombstone)
    seq = pa.array(np.arange(batch_id * n, (batch_id + 1) * n, dtype=np.int64))
    return pa.Table.from_arrays([keys, values, seq], schema=BATCH_SCHEMA)


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
