"""The state read against a scan of a MERGE-compacted table holding the same live records.

``python -m bench.state_vs_merge [--keys N] [--batches B] [--partitions P] [--out FILE]``
feeds the sink ``B`` batches of 100,000 updates of ~500 B values over ``N`` keys
(default 500,000 keys, 10 batches; ``P`` partitions by key hash, default 1) through its
``foreachBatch`` hook with its defaults (``--compression C``: the log's
``compression.type``), and MERGEs the same batches into a delta-rs
table (delete where the value is null, update, insert). Then, each best of three:

- ``sink.state()`` and Spark's scan of the MERGE table's live files, every column read
  (a count and an XOR of ``xxhash64(key, value)``: no footer answers it), and Spark's scan
  of the log's own live files (the floor for its bytes, superseded records included);
- ``read_state`` and delta-rs's ``to_pyarrow_table`` of the MERGE table (both materialize
  every column in memory).

Both sides are checked to hold the same rows. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bench.measure import load_average
from bench.session import bench_session
from sinks import CleanerConfig, CompactedStateSink, read_state

RECORDS_PER_BATCH = 100_000
VALUE_CHARS = 500
TOMBSTONE_FRACTION = 0.02
RUNS = 3


def batch(rng: np.random.Generator, keys: int, partitions: int) -> pa.Table:
    """One batch of updates: uniform keys, ~500-character values, a few tombstones."""
    ids = rng.integers(0, keys, RECORDS_PER_BATCH)
    raw = rng.integers(0, 256, (RECORDS_PER_BATCH, VALUE_CHARS // 2), dtype=np.uint8)
    values = pa.array([r.tobytes().hex() for r in raw], pa.string())
    dead = rng.random(RECORDS_PER_BATCH) < TOMBSTONE_FRACTION
    values = pc.if_else(pa.array(dead), pa.scalar(None, pa.string()), values)
    key = pa.array([f"key-{i:09d}" for i in ids])
    columns = {"key": key, "value": values}
    if partitions > 1:
        columns["partition"] = pa.array((ids % partitions).astype(np.int32))
    return pa.table(columns)


def merge(uri: str, updates: pa.Table) -> None:
    """delta-rs MERGE of one batch (its last record per key): delete, update, insert."""
    numbered = updates.append_column("_i", pa.array(np.arange(updates.num_rows)))
    last = numbered.group_by("key").aggregate([("_i", "max")])
    source = updates.take(last.column("_i_max")).select(["key", "value"])
    if not os.path.exists(uri):
        write_deltalake(uri, source.filter(pc.is_valid(source.column("value"))))
        return
    (
        DeltaTable(uri)
        .merge(source, "t.key = s.key", source_alias="s", target_alias="t")
        .when_matched_delete("s.value IS NULL")
        .when_matched_update_all()
        .when_not_matched_insert_all("s.value IS NOT NULL")
        .execute()
    )


def digest(df: DataFrame) -> tuple[int, int]:
    row = df.agg(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64("key", "value")).alias("x"))
    first = row.collect()[0]
    return int(first["n"]), int(first["x"] or 0)


def best(read: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(RUNS):
        started = time.perf_counter()
        result = read()
        times.append(time.perf_counter() - started)
    return min(times), result


def arrow_digest(table: pa.Table) -> tuple[int, str]:
    live = table.select(["key", "value"]).sort_by("key")
    return live.num_rows, str(hash(tuple(live.column("value").slice(0, 50).to_pylist())))


def run(keys: int, batches: int, partitions: int, compression: str = "zstd") -> dict[str, Any]:
    spark = bench_session()
    root = tempfile.mkdtemp(prefix="state-vs-merge-")
    try:
        sink_uri, merge_uri = os.path.join(root, "log"), os.path.join(root, "merge")
        config = CleanerConfig(compression_type=compression)
        sink = CompactedStateSink(sink_uri, key_columns=("key",), config=config)
        rng = np.random.default_rng(11)
        for b in range(batches):
            updates = batch(rng, keys, partitions)
            sink(spark.createDataFrame(updates), b)
            merge(merge_uri, updates.select(["key", "value"]))
        sink.await_cleaner()
        merged_files = DeltaTable(merge_uri).file_uris()
        result: dict[str, Any] = {
            "keys": keys,
            "batches": batches,
            "partitions": partitions,
            "compression_type": compression,
            "dirty_ratio": round(sink.dirty_ratio(), 3),
            "load_before": load_average(),
        }
        log_files = [os.path.join(sink_uri, f.path) for f in sink.log_table.snapshot().data_files()]
        result["state_s"], got = best(lambda: digest(sink.state()))
        result["spark_scan_of_log_files_s"], _ = best(
            lambda: digest(spark.read.parquet(*log_files))
        )
        result["spark_scan_s"], want = best(lambda: digest(spark.read.parquet(*merged_files)))
        assert got == want, (got, want)
        result["live_keys"] = got[0]
        result["read_state_s"], state = best(lambda: read_state(sink_uri))
        result["to_pyarrow_table_s"], table = best(lambda: DeltaTable(merge_uri).to_pyarrow_table())
        assert arrow_digest(state) == arrow_digest(table)
        result["state_ratio"] = round(result["state_s"] / result["spark_scan_s"], 2)
        result["read_state_ratio"] = round(result["read_state_s"] / result["to_pyarrow_table_s"], 2)
        result["load_after"] = load_average()
        return result
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--compression", default="zstd", help="the log's compression.type")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = run(args.keys, args.batches, args.partitions, args.compression)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
