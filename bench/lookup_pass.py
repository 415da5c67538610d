"""``python -m bench.lookup_pass``: what the key filter costs a whole pass and an append,
with records of a realistic size (512-byte values).

- Pass: a log of ``--records`` records (default 1e6; 4 partitions, 16-byte keys, each key
  written twice, all of it dirty) is built once without Spark; after a warm-up pass in
  each mode, each round copies it and runs a forced ``sink.clean(force=True)`` on the
  copy, with the Python segment writer's key filter on or off (the private
  ``KEY_FILTER_OFF_ENV`` set in the Python workers' environment), alternating which goes
  first. Every written file is checked to carry the filter, or not.
- Append: the Python segment writer writing 50,000 records over 4 partitions, with and
  without the filter, alternating.
- Spark's writer: 1e6 small records (the 48-byte values of `bench.lookup`) in 2 files
  without a filter, with the adaptive filter, and with a filter sized for the file's keys.

Wall time and CPU time (this process and all its children: the JVM, the Python workers)
as medians. Writes ``--out`` (default ``bench/lookup_pass.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.lookup import KEYS, PARTITIONS, SCHEMA, key_names, write, writer, writer_rounds
from bench.measure import load_average, machine_description
from sinks import CleanerConfig, CompactedStateSink
from sinks.log.history_window import table_properties
from sinks.log.key_filter import KEY_FILTER_OFF_ENV, spark_key_filter_options
from sinks.log.log_config import topic_table_properties
from sinks.log.log_format import LOG_END_OFFSET_TXN, PARTITIONS_TXN
from sinks.log.log_table import LogTable, log_arrow_schema

VALUE_BYTES = 512
BATCH = 131_072


def values(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` 512-byte values: a JSON-like text holding 64 random bytes as hex (zstd stores
    a record in about 75 bytes)."""
    noise = rng.integers(0, 16, (n, 128), dtype=np.uint8)
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[noise]
    hexes = pa.array(digits.view("S128").ravel()).cast(pa.string())
    head = pc.binary_join_element_wise('{"event":"update","id":"', hexes, '","payload":"', "")
    return pc.utf8_rpad(pc.binary_join_element_wise(head, hexes, "", ""), VALUE_BYTES, "x")


def records(ids: np.ndarray, partition: int, first_offset: int, rng) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "key": key_names(ids),
            "value": values(rng, n),
            "partition": pa.array(np.full(n, partition, np.int32)),
            "offset": pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
            "timestamp": pa.array(np.full(n, 1_764_000_000_000_000, np.int64)).cast(
                pa.timestamp("us", "UTC")
            ),
            "delete_horizon_ms": pa.nulls(n, pa.int64()),
        }
    )


def build_dirty(path: str, total: int, seed: int) -> dict[str, Any]:
    """A log of ``total`` records, every key written twice, nothing cleaned yet."""
    config = CleanerConfig()
    snapshot = LogTable(path).create(
        SCHEMA,
        {
            **table_properties(config.file_delete_delay_ms),
            **KEYS.to_properties(),
            **topic_table_properties(config),
        },
    )
    task = writer(path, snapshot.arrow_schema, filters=True, max_file_bytes=config.segment_bytes)
    rng = np.random.default_rng(seed)
    written, ends = [], {}
    per = total // PARTITIONS
    for p in range(PARTITIONS):
        ids = np.concatenate([rng.permutation(per // 2), rng.permutation(per // 2)])
        ids = ids * PARTITIONS + p
        written += write(
            task, [records(ids[i : i + BATCH], p, i, rng) for i in range(0, len(ids), BATCH)]
        )
        ends[p] = len(ids)
    transactions: dict[str, int] = {LOG_END_OFFSET_TXN.format(p): e for p, e in ends.items()}
    transactions[PARTITIONS_TXN] = PARTITIONS
    snapshot.commit(
        adds=written, data_change=True, transactions=transactions, info={"operation": "append"}
    )
    return {"files": len(written), "bytes": sum(w.size_bytes for w in written)}


def tree_cpu() -> float:
    """CPU seconds of this process and every live descendant (and what they reaped)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def filtered(path: str) -> list[bool]:
    """Per live file of the log at ``path``: whether it carries a key filter."""
    snapshot = LogTable(path).snapshot()
    assert snapshot is not None
    out = []
    for f in snapshot.data_files():
        meta = pq.ParquetFile(os.path.join(path, f.path)).metadata
        out.append(meta.row_group(0).column(0).bloom_filter_offset is not None)
    return out


def pass_cost(spark, template: str, work: str, rounds: int) -> dict[str, Any]:
    environment = spark.sparkContext.environment
    seconds: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    for filters in (True, False):  # not counted: the first jobs, each mode's Python workers
        warm = os.path.join(work, f"warm-up-{filters}")
        shutil.copytree(template, warm)
        _mode(environment, filters)
        CompactedStateSink(warm, ["key"]).clean(force=True)
        shutil.rmtree(warm)
    for r in range(rounds):
        for filters in (r % 2 == 0, r % 2 == 1):
            target = os.path.join(work, f"pass-{r}-{filters}")
            shutil.copytree(template, target)
            _mode(environment, filters)
            sink = CompactedStateSink(target, ["key"])
            started, started_cpu = time.perf_counter(), tree_cpu()
            stats = sink.clean(force=True)
            seconds[filters].append(time.perf_counter() - started)
            cpu[filters].append(tree_cpu() - started_cpu)
            assert stats is not None
            marks = filtered(target)
            assert all(m == filters for m in marks), (filters, marks)
            snapshot = LogTable(target).snapshot()
            sizes[filters] = sum(f.size_bytes for f in snapshot.data_files())
            shutil.rmtree(target)
            print(r, filters, seconds[filters][-1], cpu[filters][-1], flush=True)
    environment.pop(KEY_FILTER_OFF_ENV, None)
    return _ratios(seconds, cpu, sizes, rounds)


def _mode(environment: dict[str, str], filters: bool) -> None:
    """The Python workers' environment (a new set of workers per environment) for a pass
    with or without the key filter."""
    if filters:
        environment.pop(KEY_FILTER_OFF_ENV, None)
    else:
        environment[KEY_FILTER_OFF_ENV] = "1"


def append_cost(work: str, rounds: int) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    tables = [
        records(rng.integers(0, 10**7, 50_000 // PARTITIONS) * PARTITIONS + p, p, 0, rng)
        for p in range(PARTITIONS)
    ]
    schema = log_arrow_schema(SCHEMA)
    seconds, cpu, sizes = writer_rounds(os.path.join(work, "append"), schema, tables, rounds)
    return _ratios(seconds, cpu, sizes, rounds)


def spark_writer_sizing(spark, rounds: int) -> dict[str, Any]:
    """Spark's Parquet writer (parquet-mr) writing 1e6 small records in 2 files: no key
    filter, the sink's adaptive filter (`spark_key_filter_options`), and a filter sized
    for the file's 500,000 keys (``parquet.bloom.filter.expected.ndv``), in rotation; the
    first round not counted."""
    from pyspark.sql import functions as F

    rows = (
        spark.range(0, 10**6, 1, 2)
        .select(
            F.format_string("user-%010d", (F.col("id") * 7919) % 10**7).alias("key"),
            F.rpad(F.col("id").cast("string"), 48, ".").alias("value"),
            F.lit(0).cast("int").alias("partition"),
            F.col("id").alias("offset"),
        )
        .cache()
    )
    rows.count()
    schema = log_arrow_schema(SCHEMA)
    variants = {
        "none": {},
        "adaptive": spark_key_filter_options(schema, ["key"]),
        "ndv_500000": spark_key_filter_options(schema, ["key"], rows_per_file=500_000),
    }
    names = list(variants)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    sizes: dict[str, int] = {}
    filters: dict[str, list[int | None]] = {}
    for r in range(rounds + 1):
        for name in names[r % 3 :] + names[: r % 3]:
            target = os.path.join(tempfile.gettempdir(), f"bench-spark-writer-{name}")
            w = rows.write.mode("overwrite").option("compression", "zstd")
            started, started_cpu = time.perf_counter(), tree_cpu()
            w.options(**variants[name]).parquet(target)
            if r > 0:
                seconds[name].append(time.perf_counter() - started)
                cpu[name].append(tree_cpu() - started_cpu)
            files = [os.path.join(target, f) for f in os.listdir(target) if f.endswith(".parquet")]
            sizes[name] = sum(os.path.getsize(f) for f in files)
            filters[name] = [
                pq.ParquetFile(f).metadata.row_group(0).column(0).bloom_filter_length for f in files
            ]
            shutil.rmtree(target)
    rows.unpersist()
    return {
        name: {
            "wall_s": round(statistics.median(seconds[name]), 3),
            "cpu_s": round(statistics.median(cpu[name]), 3),
            "bytes": sizes[name],
            "filter_bytes_per_file": filters[name],
            "rounds": rounds,
        }
        for name in names
    }


def _ratios(seconds, cpu, sizes, rounds) -> dict[str, Any]:
    with_, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    cpu_with, cpu_without = statistics.median(cpu[True]), statistics.median(cpu[False])
    return {
        "with_filter_s": round(with_, 4),
        "without_s": round(without, 4),
        "time_ratio": round(with_ / without, 3),
        "cpu_with_s": round(cpu_with, 4),
        "cpu_without_s": round(cpu_without, 4),
        "cpu_ratio": round(cpu_with / cpu_without, 3),
        "bytes_with": sizes[True],
        "bytes_without": sizes[False],
        "bytes_ratio": round(sizes[True] / sizes[False], 4),
        "rounds": rounds,
        "seconds_with": [round(s, 3) for s in seconds[True]],
        "seconds_without": [round(s, 3) for s in seconds[False]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="bench/lookup_pass.json")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-lookup-pass-")
    report: dict[str, Any] = {
        "machine": machine_description(),
        "load_before": load_average(),
        "records": args.records,
        "value_bytes": VALUE_BYTES,
    }
    from bench.session import bench_session

    spark = bench_session()
    try:
        report["append_50k"] = append_cost(work, 9)
        print(json.dumps(report["append_50k"]), flush=True)
        template = os.path.join(work, "template")
        report["log"] = build_dirty(template, args.records, seed=1)
        report["pass"] = pass_cost(spark, template, work, args.rounds)
        report["spark_writer_1e6"] = spark_writer_sizing(spark, args.rounds)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = load_average()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
