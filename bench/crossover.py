"""``python -m bench.crossover``: the sink against per-batch MERGE on a table that is already large.

The main run (`bench.run`) starts every system from an empty table, so at 1e6
keys MERGE's table never exceeds ~25 MB and delta-rs rewrites it in well under
a second: per-batch MERGE then costs about what any Spark job costs. MERGE's
cost grows with the bytes of the files its keys touch (copy-on-write: with keys
spread by hash, every file), the sink's append does not. This measures both on
a table of ``--keys`` live keys loaded beforehand (untimed), then ``--batches``
uniform update batches of the main run's size, timed one by one. ``--keys`` takes
a comma-separated list of sizes: each is loaded and measured in turn, which places
the crossover by table size on measured points (``by_size`` in the output).
``--record-size 512B`` uses the CDC-like records of the 512 B workloads.

The sink's load ends with a pass over the whole table (its first batch is all
dirty); that pass is timed and reported apart, because with
``min.cleanable.dirty.ratio`` 0.5 the next one only comes once the dirty tail has
grown to the table's size: its cost per batch is the pass time divided by the
batches it takes to get there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import WriterProperties, write_deltalake

from bench.measure import delta_table_size, load_average, machine_description
from bench.report import versions
from bench.session import bench_session
from bench.systems import MergeSystem, SinkSystem, checksum
from bench.workload import BATCH_SCHEMA, VALUE_BYTES, Workload, batch_table, cdc_table

log = logging.getLogger("bench")


def base_table(keys: int, seed: int = 11, record_size: str = "35B") -> pa.Table:
    """One live record per key, ``seq`` below every update's (they start at ``keys``)."""
    rng = np.random.default_rng(seed)
    if record_size == "512B":
        workload = Workload(
            name="base",
            keys=keys,
            batches=1,
            records_per_batch=keys,
            record_size="512B",
            tombstone_fraction=0.0,
        )
        ids = np.arange(keys)
        padded = pc.utf8_lpad(pa.array(ids).cast(pa.string()), width=8, padding="0")
        return cdc_table(rng, workload, 0, ids, pc.binary_join_element_wise("k", padded, ""))
    ids = np.char.zfill(np.arange(keys).astype(str), 8)
    raw = rng.integers(97, 123, size=(keys, VALUE_BYTES), dtype=np.uint8)
    values = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(VALUE_BYTES), keys, [None, pa.py_buffer(raw.tobytes())]
    ).cast(pa.binary())
    return pa.Table.from_arrays(
        [pa.array(np.char.add("k", ids).tolist(), pa.string()), values, pa.array(np.arange(keys))],
        schema=BATCH_SCHEMA,
    )


def update_files(
    keys: int, batches: int, records: int, directory: str, record_size: str = "35B"
) -> list[str]:
    """Uniform update batches over ``keys`` keys (2 % tombstones), ``seq`` after the base."""
    workload = Workload(
        name="crossover",
        keys=keys,
        batches=batches,
        records_per_batch=records,
        record_size=record_size,  # type: ignore[arg-type]
    )
    rng = np.random.default_rng(workload.seed)
    paths = []
    for batch_id in range(batches):
        table = batch_table(rng, workload, batch_id)
        seq = pa.array(np.arange(table.num_rows) + keys + batch_id * records)
        table = table.set_column(2, "seq", seq)
        path = os.path.join(directory, f"update-{batch_id:05d}.parquet")
        pq.write_table(table, path, compression="zstd")
        paths.append(path)
    return paths


def run(
    keys: int, batches: int, records: int, work: str, record_size: str = "35B"
) -> dict[str, Any]:
    spark = bench_session()
    started = time.perf_counter()
    try:
        os.makedirs(os.path.join(work, "input"), exist_ok=True)
        base_path = os.path.join(work, "input", "base.parquet")
        base = base_table(keys, record_size=record_size)
        pq.write_table(base, base_path, compression="zstd")
        updates = update_files(keys, batches, records, os.path.join(work, "input"), record_size)
        results: dict[str, Any] = {
            "machine": machine_description(),
            "versions": versions(spark),
            "load_before": load_average(),
            "keys": keys,
            "batches": batches,
            "records_per_batch": records,
            "record_size": record_size,
            "systems": {},
        }

        merge = MergeSystem(os.path.join(work, "merge"), base.schema)
        load = time.perf_counter()
        write_deltalake(
            merge.table_uri,
            base,
            mode="overwrite",
            writer_properties=WriterProperties(compression="ZSTD"),
        )
        merge_load_s = time.perf_counter() - load
        del base

        sink = SinkSystem(os.path.join(work, "sink"), compact=True, background=False)
        load = time.perf_counter()
        info = sink.ingest(spark, 0, base_path)
        sink_load_s = time.perf_counter() - load
        load_pass = info.get("clean", {})

        for name, system, first in (("merge_per_batch", merge, 0), ("compacted_sink", sink, 1)):
            per_batch = []
            for i, path in enumerate(updates):
                t = time.perf_counter()
                info = system.ingest(spark, first + i, path)
                per_batch.append(time.perf_counter() - t)
                if "clean" in info:
                    log.warning("%s: a pass ran at update %d (not expected)", name, i)
                log.info("%s update %d: %.2f s", name, i, per_batch[-1])
            size = delta_table_size(system.table_uri)
            rows, digest = checksum(system.state(spark))
            results["systems"][name] = {
                "per_batch_s": per_batch,
                "median_s": statistics.median(per_batch),
                "table_bytes": size.bytes,
                "files": size.files,
                "live_keys": rows,
                "state_checksum": digest,
            }
        results["systems"]["merge_per_batch"]["load_s"] = merge_load_s
        results["systems"]["compacted_sink"]["load_s"] = sink_load_s
        table_bytes = results["systems"]["compacted_sink"]["table_bytes"]
        batch_bytes = sum(os.path.getsize(p) for p in updates) / len(updates)
        pass_s = load_pass.get("duration_s")
        results["sink_pass"] = {
            "pass_s": pass_s,
            "records_read": load_pass.get("records_read"),
            "bytes_read": load_pass.get("bytes_read"),
            # the next pass comes once the dirty tail holds as many bytes as the clean table
            "batches_between_passes": table_bytes / batch_bytes,
            "amortized_s_per_batch": (pass_s or 0) * 2 * batch_bytes / table_bytes,
        }
        digests = {s["state_checksum"] for s in results["systems"].values()}
        results["states_agree"] = len(digests) == 1
        results["load_after"] = load_average()
        results["total_s"] = time.perf_counter() - started
        return results
    finally:
        spark.stop()


def crossover_point(r: dict[str, Any]) -> dict[str, Any]:
    """One measured size: table MB, MERGE's and the sink's per-batch cost, and their ratio.

    The sink's cost is its median append plus its amortized pass (the load's pass
    over the whole table, spread over the batches until the next one).
    """
    merge = r["systems"]["merge_per_batch"]["median_s"]
    sink_append = r["systems"]["compacted_sink"]["median_s"]
    sink = sink_append + (r["sink_pass"]["amortized_s_per_batch"] or 0.0)
    return {
        "keys": r["keys"],
        "record_size": r.get("record_size", "35B"),
        "table_mb": r["systems"]["compacted_sink"]["table_bytes"] / 1e6,
        "merge_table_mb": r["systems"]["merge_per_batch"]["table_bytes"] / 1e6,
        "merge_s_per_batch": merge,
        "sink_append_s_per_batch": sink_append,
        "sink_s_per_batch_amortized": sink,
        "sink_speedup": merge / sink if sink else None,
        "states_agree": r["states_agree"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crossover", description=__doc__)
    parser.add_argument("--keys", default="5000000", help="comma-separated table sizes (keys)")
    parser.add_argument("--record-size", default="35B", choices=("35B", "512B"))
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--out", default="bench/crossover.json")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("compacted_sink").setLevel(logging.WARNING)
    runs = []
    for keys in (int(k) for k in args.keys.split(",")):
        work = tempfile.mkdtemp(prefix="compacted-sink-crossover-")
        try:
            runs.append(run(keys, args.batches, args.records, work, args.record_size))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for name, s in runs[-1]["systems"].items():
            print(
                f"{keys} keys, {name}: median {s['median_s']:.2f} s/batch, "
                f"table {s['table_bytes'] / 1e6:.0f} MB in {s['files']} files, "
                f"load {s['load_s']:.1f} s"
            )
        print(
            f"sink pass at load: {runs[-1]['sink_pass']}; states agree: {runs[-1]['states_agree']}"
        )
    # The largest run's figures stay at the top level (the file's original shape).
    results = {**runs[-1], "by_size": [crossover_point(r) for r in runs]}
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
