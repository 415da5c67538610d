"""``python -m bench.append_writers``: the append's two writers against Spark's plain Parquet write.

Issue #33, point 1. The same batches (512-byte values, 4 partitions) go, in one run
and alternating batch by batch so that a change of load weighs on all, through:

- ``python``: the append through the Python workers (``mapInArrow``), main's path before #33;
- ``spark``: the append through Spark's own Parquet writer (`sinks.produce.spark_append`);
- ``spark_parquet``: ``spark.read.parquet(batch).write.parquet(...)``, the floor;
- ``spark_parquet_by_partition``: the same write ``partitionBy("partition")``: Spark's own
  writer splitting the batch by partition as a log must (a segment holds one partition),
  the floor of any writer of per-partition files.

For Kafka input (``offset`` given, each input file one partition, read as Spark's Kafka
source reads a topic: one input partition per partition's file) and for assigned
offsets. Prints one JSON row per (size, input) with the median and p99 batch of each
and their ratios to the floor; writes them to ``--out`` (default
``bench/append_writers.json``). The first batch of each system is a warm-up, not counted.
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

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.measure import load_average, machine_description
from bench.scale import open_sink, records
from bench.session import bench_session
from sinks.produce.spark_append import APPEND_WRITER_ENV

_OPEN_COST = "spark.sql.files.openCostInBytes"
SPLIT_FLOOR = "spark_parquet_by_partition"
"""Spark's Parquet write split by ``partition`` (``partitionBy``): a file per partition and
task, as a log's segments are (one partition a segment), with no sink in it."""


def p99(runs: list[float]) -> float:
    ordered = sorted(runs)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def batches(spark: SparkSession, root: str, *, per_batch: int, count: int, kafka: bool) -> list:
    paths = []
    total = per_batch * count
    for b in range(count):
        batch = records(spark, b * per_batch, per_batch, total=total, partitions=4, value_bytes=512)
        path = os.path.join(root, "batches", str(b))
        if kafka:  # a file per partition, in offset order, as a topic's partitions are
            batch = batch.withColumn("offset", F.monotonically_increasing_id() + b * 2**40)
            batch = batch.cache()
            for partition in range(4):
                one = batch.filter(F.col("partition") == partition).coalesce(1)
                one.sortWithinPartitions("offset").write.mode("append").parquet(path)
            batch.unpersist()
        else:
            batch.write.parquet(path)
        paths.append(path)
    return paths


def run(
    spark: SparkSession, work: str, *, per_batch: int, count: int, kafka: bool, writers: list[str]
) -> dict[str, Any]:
    root = os.path.join(work, f"{per_batch}-{'kafka' if kafka else 'assigned'}")
    inputs = batches(spark, root, per_batch=per_batch, count=count, kafka=kafka)
    sinks = {}
    for w in writers:  # an appender reads its writer once, when it is built
        os.environ[APPEND_WRITER_ENV] = w
        sinks[w] = open_sink(os.path.join(root, f"log-{w}"))
    runs: dict[str, list[float]] = {w: [] for w in [*writers, "spark_parquet", SPLIT_FLOOR]}
    if kafka:
        # Read as Spark's Kafka source reads a topic: each partition's records are input
        # partitions of their own, never packed with another partition's file (the floor
        # reads the same way).
        spark.conf.set(_OPEN_COST, str(1 << 40))
    try:
        for b, path in enumerate(inputs):
            for w, sink in sinks.items():
                started = time.perf_counter()
                sink(spark.read.parquet(path), b)
                runs[w].append(time.perf_counter() - started)
            started = time.perf_counter()
            spark.read.parquet(path).write.mode("append").parquet(os.path.join(root, "parquet"))
            runs["spark_parquet"].append(time.perf_counter() - started)
            started = time.perf_counter()
            split = spark.read.parquet(path).write.mode("append").partitionBy("partition")
            split.parquet(os.path.join(root, "parquet-by-partition"))
            runs[SPLIT_FLOOR].append(time.perf_counter() - started)
    finally:
        spark.conf.unset(_OPEN_COST)
    held = {w: sink.log().count() for w, sink in sinks.items()}
    assert len(set(held.values())) == 1, f"the logs differ: {held}"  # the same records
    shutil.rmtree(root, ignore_errors=True)
    row: dict[str, Any] = {
        "records_per_batch": per_batch,
        "input": "kafka" if kafka else "assigned offsets",
        "batches": count,
        "load": load_average(),
    }
    floor_median = statistics.median(runs["spark_parquet"][1:])
    floor_p99 = p99(runs["spark_parquet"][1:])
    for name, times in runs.items():
        counted = times[1:]
        row[f"{name}_median_s"] = round(statistics.median(counted), 3)
        row[f"{name}_p99_s"] = round(p99(counted), 3)
        row[f"{name}_runs_s"] = [round(x, 3) for x in times]
        if name != "spark_parquet":
            row[f"{name}_median_ratio"] = round(statistics.median(counted) / floor_median, 2)
            row[f"{name}_p99_ratio"] = round(p99(counted) / floor_p99, 2)
    split_median = statistics.median(runs[SPLIT_FLOOR][1:])
    for name in writers:
        row[f"{name}_median_ratio_to_split"] = round(
            statistics.median(runs[name][1:]) / split_median, 2
        )
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("runs_s")}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/append_writers.json")
    parser.add_argument("--batches", default="50000:12,1000000:6", help="size:count,...")
    parser.add_argument("--writers", default="python,spark")
    parser.add_argument("--inputs", default="assigned,kafka")
    args = parser.parse_args()
    spark = bench_session()
    work = tempfile.mkdtemp(prefix="bench-append-")
    rows = []
    try:
        for spec in args.batches.split(","):
            size, count = (int(float(x)) for x in spec.split(":"))
            for kind in args.inputs.split(","):
                rows.append(
                    run(
                        spark,
                        work,
                        per_batch=size,
                        count=count,
                        kafka=kind == "kafka",
                        writers=args.writers.split(","),
                    )
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine_description(), "append": rows}, f, indent=1)


if __name__ == "__main__":
    main()
