"""A consumer's bootstrap read of a 1e6-record log against Spark reading the same files.

Builds a log of ``--records`` records (``--partitions`` partitions, distinct keys,
``--value-bytes``-byte hex string values, one forced pass), then times, best of
``--repeat``, each read written to Spark's ``noop`` sink (every row and column
materialized, nothing written):

- ``parquet``: ``spark.read.parquet(<the log's live files>)``, the floor of any reader;
- ``batch``: ``spark.read.format("compacted-state").load(path)`` (earliest to latest);
- ``stream``: ``readStream.format("compacted-state")`` from earliest, ``availableNow``
  (the bootstrap micro-batch, plus the query's start and its offset log);
- ``file_stream``: Spark's own Parquet file stream over a copy of the same files,
  ``availableNow``: the floor of any streaming bootstrap (a query's start, its offset and
  commit logs), which a batch read does not pay;
- ``python_source``: a Python streaming data source of one row (`OneRow`), ``availableNow``:
  what any source written in Python pays before its first record, Spark starting the
  Python process that runs the source's driver side (the floor of the ``stream`` read's
  start, with no log to open).

For each streaming read, ``*_trigger_s`` is the micro-batch as the query's progress
reports it (``triggerExecution``); the rest of its time is the query's start and stop,
for the consumers' source mostly Spark starting the Python process that runs the
source's driver side (``prepareForTriggerAvailableNow``, ``latestOffset``, ...).

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
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.uris import join
from streaming.consumers.datasource import register
from streaming.jobs.session import local_session


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


class OneRow(DataSource):
    """A streaming source of one row: the cost of a Python source with nothing to read."""

    @classmethod
    def name(cls) -> str:
        return "one-row"

    def schema(self) -> str:
        return "id int"

    def streamReader(self, schema):
        return _OneRowReader()


class _OneRowReader(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"row": 0}

    def latestOffset(self) -> dict:
        return {"row": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0)] if start["row"] < end["row"] else []

    def read(self, partition):
        yield (1,)


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
    spark.dataSource.register(OneRow)
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

        copies = base / "files"
        copies.mkdir()
        for number, file in enumerate(files):
            shutil.copy(file, copies / f"part-{number}.parquet")
        schema = spark.read.parquet(str(copies)).schema
        runs = [0]
        triggers: dict[str, list[float]] = {"stream": [], "file_stream": [], "python_source": []}

        def run_query(name: str, reader) -> None:
            runs[0] += 1
            query = (
                reader.writeStream.format("noop")
                .option("checkpointLocation", str(base / f"chk-{runs[0]}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            ms = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
            triggers[name].append(ms / 1000)

        def stream() -> None:
            run_query(
                "stream",
                spark.readStream.format("compacted-state")
                .option("startingOffsets", "earliest")
                .load(path),
            )

        def file_stream() -> None:
            run_query("file_stream", spark.readStream.schema(schema).parquet(str(copies)))

        def python_source() -> None:
            run_query("python_source", spark.readStream.format("one-row").load())

        assert spark.read.format("compacted-state").load(path).count() == rows
        figures = {"records": rows, "files": len(files), "bytes": size}
        actions = (
            ("parquet", parquet),
            ("batch", batch),
            ("stream", stream),
            ("file_stream", file_stream),
            ("python_source", python_source),
        )
        for name, action in actions:
            action()  # warm up: JIT, Python workers
            figures[f"{name}_s"] = min(timed(action) for _ in range(args.repeat))
        for name, seconds in triggers.items():
            figures[f"{name}_trigger_s"] = min(seconds[1:])  # the warm-up left out
        for name in ("batch", "stream", "file_stream"):
            figures[f"{name}_speed_ratio"] = figures["parquet_s"] / figures[f"{name}_s"]
        figures["stream_to_file_stream_ratio"] = figures["file_stream_s"] / figures["stream_s"]
        # The stream's time less what any Python source pays, against the file stream's.
        figures["stream_beyond_python_source_s"] = figures["stream_s"] - figures["python_source_s"]
        print(json.dumps(figures, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
