"""A consumer's bootstrap read of a 1e6-record log against Spark reading the same files.

Builds a log of ``--records`` records (``--partitions`` partitions, distinct keys,
``--value-bytes``-byte hex string values, one forced pass), then times, best of
``--repeat``, each read written to Spark's ``noop`` sink (every row and column
materialized, nothing written):

- ``parquet``: ``spark.read.parquet(<the log's live files>)``, the floor of any reader;
- ``batch``: ``spark.read.format("compacted-state").load(path)`` (earliest to latest);
- ``stream``: ``readStream.format("compacted-state")`` from earliest, ``availableNow``
  (the bootstrap micro-batch, plus the query's start and its offset log).

Speed is records per second; the ratio is parquet's time over the reader's (1.0: as
fast as Spark's Parquet scan). Run: ``python -m bench.consumer_read`` (``--help``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.storage import join
from streaming.datasource import register
from streaming.session import local_session


def build_log(spark: SparkSession, path: str, records: int, partitions: int, value_bytes: int):
    sink = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    batches = 4
    per_batch = records // batches
    for b in range(batches):
        ids = F.col("id").cast("string")
        df = spark.range(b * per_batch, (b + 1) * per_batch, numPartitions=4).select(
            F.concat(F.lit("key-"), ids).alias("key"),
            F.substring(F.concat(F.sha2(ids, 512), F.md5(ids)), 1, value_bytes).alias("value"),
            (F.col("id") % partitions).cast("int").alias("partition"),
        )
        sink(df, b)
    sink.clean(force=True)
    return sink


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    spark = local_session("consumer-read", "local[2]", conf={"spark.ui.enabled": "false"})
    register(spark)
    base = Path(tempfile.mkdtemp(prefix="consumer-read-"))
    try:
        path = str(base / "log")
        sink = build_log(spark, path, args.records, args.partitions, args.value_bytes)
        snapshot = sink.log_table.snapshot()
        files = [join(path, s.path) for s in snapshot.all_segments()]
        rows = sum(s.num_records for s in snapshot.all_segments())
        size = sum(s.size_bytes for s in snapshot.all_segments())

        def parquet() -> None:
            spark.read.parquet(*files).write.format("noop").mode("overwrite").save()

        def batch() -> None:
            spark.read.format("compacted-state").load(path).write.format("noop").mode(
                "overwrite"
            ).save()

        runs = [0]

        def stream() -> None:
            runs[0] += 1
            query = (
                spark.readStream.format("compacted-state")
                .option("startingOffsets", "earliest")
                .load(path)
                .writeStream.format("noop")
                .option("checkpointLocation", str(base / f"chk-{runs[0]}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        assert spark.read.format("compacted-state").load(path).count() == rows
        figures = {"records": rows, "files": len(files), "bytes": size}
        for name, action in (("parquet", parquet), ("batch", batch), ("stream", stream)):
            action()  # warm up: JIT, Python workers
            figures[f"{name}_s"] = min(timed(action) for _ in range(args.repeat))
        for name in ("batch", "stream"):
            figures[f"{name}_speed_ratio"] = figures["parquet_s"] / figures[f"{name}_s"]
        print(json.dumps(figures, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
