"""The change feed's cost at 1e6 keys × 512 B: the append, its bytes, and reading one batch's feed.

Builds a log of ``--keys`` distinct keys (``--value-bytes``-byte string values, 4
partitions, one forced pass), then appends one batch of ``--batch`` updates (half of
existing keys, a tenth of them tombstones, the rest new keys) and reads that batch's
feed (``readChangeFeed`` with ``startingVersion = endingVersion =`` its version, to
Spark's ``noop`` sink). The same on delta-spark: a table of the same rows with
``delta.enableChangeDataFeed`` on and one with it off, the batch's latest per key
merged into each (``MERGE``), then ``table_changes`` of the merge's version read.

The sink computes before-images when the feed is read (design.md §57): its append is
the same with or without readers of the feed, so "feed on" and "feed off" are one
figure, and it writes no change-data file. Delta's MERGE writes ``_change_data`` files
with the feed on: its bytes and time are measured both ways.

Run on a session with delta-spark (``.venv-spark4.2``, jars in ``.jars``):
``python -m bench.change_feed`` (``--help``); writes ``bench/change_feed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import CleanerConfig, CompactedStateSink
from streaming.consumers.datasource import register


def rows(spark: SparkSession, start: int, end: int, value_bytes: int, salt: str) -> DataFrame:
    ids = F.col("id").cast("string")
    text = F.repeat(F.sha2(F.concat(ids, F.lit(salt)), 512), value_bytes // 128 + 1)
    return spark.range(start, end, numPartitions=4).select(
        F.concat(F.lit("key-"), ids).alias("key"),
        F.substring(text, 1, value_bytes).alias("value"),
        (F.col("id") % 4).cast("int").alias("partition"),
    )


def update_batch(spark: SparkSession, keys: int, size: int, value_bytes: int) -> DataFrame:
    """Half updates of existing keys (a tenth tombstones), half new keys."""
    old = rows(spark, 0, size // 2, value_bytes, "u").withColumn(
        "value", F.when(F.col("key").endswith("7"), F.lit(None)).otherwise(F.col("value"))
    )
    new = rows(spark, keys, keys + size - size // 2, value_bytes, "n")
    return old.unionByName(new)


def size_of(path: str, under: str = "") -> int:
    root = Path(path) / under
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return round(time.perf_counter() - start, 2)


def bench_sink(spark: SparkSession, root: str, args) -> dict:
    path = os.path.join(root, "log")
    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    per = args.keys // 4
    for b in range(4):
        sink(rows(spark, b * per, (b + 1) * per, args.value_bytes, "0"), b)
    sink.clean(force=True)
    before = size_of(path)
    batch = update_batch(spark, args.keys, args.batch, args.value_bytes).cache()
    batch.count()
    append_s = timed(lambda: sink(batch, 10))
    written = size_of(path) - before
    version = sink.log_table.snapshot().version
    register(spark)
    feed = (
        spark.read.format("compacted-state")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(path)
    )
    changes = feed.count()
    read_s = min(
        timed(lambda: feed.write.format("noop").mode("overwrite").save()) for _ in range(2)
    )
    return {
        "append_s": append_s,
        "append_bytes": written,
        "feed_rows": changes,
        "feed_read_s": read_s,
    }


def bench_delta(spark: SparkSession, root: str, args, cdf: bool) -> dict:
    path = os.path.join(root, f"delta-cdf-{str(cdf).lower()}")
    rows(spark, 0, args.keys, args.value_bytes, "0").select("key", "value").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", str(cdf).lower()).save(path)
    batch = update_batch(spark, args.keys, args.batch, args.value_bytes).select("key", "value")
    batch.cache().count()
    batch.createOrReplaceTempView("bench_cdf_source")
    before = size_of(path)
    merge_s = timed(
        lambda: spark.sql(
            f"""MERGE INTO delta.`{path}` t USING bench_cdf_source s ON t.key = s.key
            WHEN MATCHED AND s.value IS NULL THEN DELETE
            WHEN MATCHED THEN UPDATE SET t.value = s.value
            WHEN NOT MATCHED AND s.value IS NOT NULL
            THEN INSERT (key, value) VALUES (s.key, s.value)"""
        ).collect()
    )
    figures = {
        "merge_s": merge_s,
        "merge_bytes": size_of(path) - before,
        "change_data_bytes": size_of(path, "_change_data"),
    }
    if cdf:
        version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0].version
        changes = spark.sql(f"SELECT * FROM table_changes_by_path('{path}', {version}, {version})")
        figures["feed_rows"] = changes.count()
        figures["feed_read_s"] = min(
            timed(lambda: changes.write.format("noop").mode("overwrite").save()) for _ in range(2)
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=512)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--out", default="bench/change_feed.json")
    args = parser.parse_args()
    from tests.conftest import build_session

    spark = build_session()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as root:
        result = {"keys": args.keys, "value_bytes": args.value_bytes, "batch": args.batch}
        result["sink"] = bench_sink(spark, root, args)
        print(json.dumps(result), flush=True)
        result["delta_cdf_on"] = bench_delta(spark, root, args, cdf=True)
        result["delta_cdf_off"] = bench_delta(spark, root, args, cdf=False)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
