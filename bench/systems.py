"""The systems under test, each fed the same batch files one batch at a time.

- ``compacted_sink``: `CompactedStateSink` called as the foreachBatch hook with
  cleaning in the background, as a streaming query gets it (``cleaning="auto"``
  inside a query): the hook appends and wakes the cleaner thread, which cleans when
  a partition's dirty ratio passes 0.5 (the default) while the next batches append.
  ``compacted_sink_inline`` is the same with passes in the hook (the synchronous mode);
  ``compacted_sink_not_niced`` the same with ``log.cleaner.nice`` 0 (the pass's tasks
  at the query's CPU priority). ``compacted_sink_dirty_075`` the same with
  ``min.cleanable.dirty.ratio`` 0.75, a user's tuning as in Kafka: fewer, later passes
  (fewer bytes written) for a longer log to replay. ``compacted_sink_combined`` the same
  with ``combine.before.append`` on: a batch stores only the last record of each key.
- ``sink_cleaning_off``: the same hook with cleaning disabled (ratio 1.0 is never
  exceeded): the sink's own append, and the replay ceiling. (Named ``append_only`` in
  results before 24 November 2026.)
- ``spark_parquet``: Spark writing each batch as plain Parquet files (no Delta, no
  offsets, no dedupe): the floor of any Spark sink's batch. Its state is resolved when
  read (latest per key, tombstones dropped), as a reader of plain files must.
- ``merge_per_batch``: delta-rs MERGE fed as a foreachBatch user's code feeds it:
  the batch is a Spark DataFrame, deduped in Spark (latest per key), collected to
  Arrow (``toArrow``), then ``deltalake.DeltaTable.merge`` (delete on tombstone).
- ``delta_spark_merge``: Delta's documented foreachBatch upsert on Spark's own Delta
  (delta-spark): dedupe the batch in Spark (latest per key), then ``MERGE INTO`` the
  table (``WHEN MATCHED AND s.value IS NULL THEN DELETE``), idempotent through the
  session's ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` (the batch id).
- ``delta_spark_append``: Spark's own Delta append of the batch
  (``df.write.format("delta").mode("append")`` with the writer's ``txnAppId`` /
  ``txnVersion`` options): the floor of a Delta sink's batch. Like ``spark_parquet``
  it keeps every record, so its state is resolved when read.
- ``rewrite_per_batch``: table ∪ batch → latest per key → overwrite, in Spark;
  the new Parquet files replace the old ones in one Delta commit (delta-rs).

Every system writes zstd Parquet. ``replay`` materializes the state (key, value)
and returns its row count and an order-independent checksum, so the systems'
final states can be checked against each other.
"""

from __future__ import annotations

import glob
import os
import threading
import time
import uuid
from typing import Any, Protocol

import pyarrow as pa
from deltalake import DeltaTable, WriterProperties
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.delta_upsert import latest_per_key, merge_batch
from bench.measure import TableSize, delta_table_size
from bench.recopy import pass_recopy
from bench.session import delta_spark_on
from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.cleaner_stats import CleanerStats
from sinks.spark_compat import to_arrow

TABLE_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("seq", pa.int64())])
SYSTEMS = (
    "compacted_sink",
    "merge_per_batch",
    "rewrite_per_batch",
    "sink_cleaning_off",
    "spark_parquet",
)
# Spark's own Delta: they need delta-spark on the session (`make jars`, pyspark 4.2).
DELTA_SPARK_SYSTEMS = ("delta_spark_merge", "delta_spark_append")
OPTIONAL_SYSTEMS = (
    "compacted_sink_inline",
    "compacted_sink_not_niced",
    "compacted_sink_dirty_075",
    "compacted_sink_dirty_020",
    "compacted_sink_combined",
)


class System(Protocol):
    name: str
    root: str
    table_uri: str

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]: ...

    def analyse(self, info: dict[str, Any]) -> None: ...

    def state(self, spark: SparkSession) -> DataFrame: ...


def checksum(df: DataFrame) -> tuple[int, int]:
    """Rows and XOR of xxhash64(key, value) over ``df``: materializes every key and value."""
    row = df.agg(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64("key", "value")).alias("x"))
    first = row.collect()[0]
    return int(first["n"]), int(first["x"] or 0)


class SinkSystem:
    """The compacted-state sink (``compact=True``) or the same hook never cleaning.

    With ``background`` (the default) passes run on the sink's cleaner thread; each
    batch reports the pass that finished while it ran, if any, and `finish` waits
    for the last round (the drain, timed apart).
    """

    def __init__(
        self,
        root: str,
        *,
        compact: bool,
        name: str | None = None,
        background: bool = True,
        nice: int = CleanerConfig.log_cleaner_nice,
        dirty_ratio: float = 0.5,
        combine: bool = False,
    ) -> None:
        self.name = name or ("compacted_sink" if compact else "sink_cleaning_off")
        self.root = root
        self.table_uri = os.path.join(root, "log")
        ratio = dirty_ratio if compact else 1.0  # a ratio is never > 1.0: never cleans
        self.sink = CompactedStateSink(
            self.table_uri,
            key_columns=("key",),
            config=CleanerConfig(
                min_cleanable_dirty_ratio=ratio,
                log_cleaner_nice=nice,
                combine_before_append=combine,
            ),
            sink_id=f"bench-{self.name}",
            cleaning="background" if background and compact else "inline",
        )
        self._finished: list[CleanerStats] = []
        self._lock = threading.Lock()
        self.sink.add_pass_listener(self._on_pass)

    def _on_pass(self, stats: CleanerStats) -> None:
        with self._lock:
            self._finished.append(stats)

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        self.sink(spark.read.parquet(batch_path).select("key", "value"), batch_id)
        report = self.sink.last_append
        info: dict[str, Any] = {"dirty_ratio": report.dirty_ratio} if report else {}
        with self._lock:
            finished, self._finished = self._finished, []
        if finished:
            info["clean"] = _pass_figures(finished[-1])
            info["clean"]["background"] = self.sink.cleaning == "background"
            if len(finished) > 1:
                info["passes_finished"] = len(finished)
        return info

    def finish(self) -> float:
        """Wait for the cleaner's last round; returns the seconds waited."""
        started = time.perf_counter()
        self.sink.await_cleaner()
        return time.perf_counter() - started

    def close(self) -> None:
        """End the sink's cleaner thread (after the last round)."""
        self.sink.close()

    def analyse(self, info: dict[str, Any]) -> None:
        """Untimed: add the pass's clean-vs-dirty recopy figures to ``info``."""
        clean = info.get("clean")
        if clean and clean.get("delta_version") is not None:
            clean["recopy"] = pass_recopy(
                self.sink.log_table,
                clean["delta_version"],
                clean["first_dirty_offsets"],
                clean["end_offsets"],
            )

    def state(self, spark: SparkSession) -> DataFrame:
        return self.sink.state()


def _pass_figures(clean: CleanerStats) -> dict[str, Any]:
    return {
        "duration_s": clean.duration_ms / 1000,
        "segments_read": clean.segments_read,
        "segments_written": clean.segments_written,
        "bytes_read": clean.bytes_read,
        "bytes_written": clean.bytes_written,
        "records_read": clean.records_read,
        "records_written": clean.records_written,
        "first_dirty_offsets": clean.first_dirty_offsets,
        "end_offsets": clean.end_offsets,
        "delta_version": clean.delta_version,
    }


class MergeSystem:
    """Dedupe each batch in Spark, then ``DeltaTable.merge`` it (delete on tombstone)."""

    name = "merge_per_batch"

    def __init__(self, root: str, schema: pa.Schema = TABLE_SCHEMA) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")
        DeltaTable.create(self.table_uri, schema, mode="ignore")
        self.writer = WriterProperties(compression="ZSTD")

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        source = to_arrow(latest_per_key(spark.read.parquet(batch_path)))
        metrics = (
            DeltaTable(self.table_uri)
            .merge(
                source,
                predicate="t.key = s.key",
                source_alias="s",
                target_alias="t",
                writer_properties=self.writer,
            )
            .when_matched_delete(predicate="s.value IS NULL")
            .when_matched_update_all()
            .when_not_matched_insert_all(predicate="s.value IS NOT NULL")
            .execute()
        )
        keep = ("num_target_files_added", "num_target_files_removed", "num_target_rows_copied")
        return {"merge": {k: metrics.get(k) for k in keep}}

    def analyse(self, info: dict[str, Any]) -> None:
        pass

    def state(self, spark: SparkSession) -> DataFrame:
        return _read_live(spark, self.table_uri)


class RewriteSystem:
    """table ∪ batch → latest per key → overwrite, in Spark; committed as a Delta overwrite."""

    name = "rewrite_per_batch"

    def __init__(self, root: str, schema: pa.Schema = TABLE_SCHEMA) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")
        self.schema = schema
        DeltaTable.create(self.table_uri, schema, mode="ignore")

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        table = DeltaTable(self.table_uri)
        old = pa.table(table.get_add_actions(flatten=True))
        batch = spark.read.parquet(batch_path)
        if old.num_rows:
            paths = [os.path.join(self.table_uri, p) for p in old.column("path").to_pylist()]
            batch = spark.read.schema(batch.schema).parquet(*paths).unionByName(batch)
        directory = f"v{batch_id:05d}"
        (
            latest_per_key(batch)
            .filter(F.col("value").isNotNull())
            .write.mode("error")
            .parquet(os.path.join(self.table_uri, directory))
        )
        stamp = int(time.time() * 1000)
        # "overwrite" removes every live file itself (delta-rs refuses explicit removes).
        actions: list[Any] = []
        for path in sorted(glob.glob(os.path.join(self.table_uri, directory, "part-*.parquet"))):
            relative = os.path.relpath(path, self.table_uri)
            actions.append(AddAction(relative, os.path.getsize(path), {}, stamp, True, "{}"))
        table.create_write_transaction(actions, "overwrite", self.schema)
        return {}

    def analyse(self, info: dict[str, Any]) -> None:
        pass

    def state(self, spark: SparkSession) -> DataFrame:
        return _read_live(spark, self.table_uri)


class SparkParquetSystem:
    """Spark appending each batch as plain Parquet: what any Spark sink's batch costs at least."""

    name = "spark_parquet"

    def __init__(self, root: str) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "parquet")

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        spark.read.parquet(batch_path).write.mode("append").parquet(self.table_uri)
        return {}

    def analyse(self, info: dict[str, Any]) -> None:
        pass

    def size(self) -> TableSize:
        paths = tuple(sorted(glob.glob(os.path.join(self.table_uri, "*.parquet"))))
        return TableSize(sum(os.path.getsize(p) for p in paths), len(paths), paths)

    def state(self, spark: SparkSession) -> DataFrame:
        latest = latest_per_key(spark.read.parquet(self.table_uri))
        return latest.filter(F.col("value").isNotNull()).select("key", "value")


class DeltaSparkMergeSystem:
    """foreachBatch + delta-spark ``MERGE INTO``, as Delta's docs write the upsert.

    The batch is deduped in Spark (latest per key by ``seq``), then merged with SQL;
    a tombstone deletes its key. The session's ``txnAppId`` / ``txnVersion`` are set
    around the MERGE (the batch id as version), so a replayed batch commits nothing.
    """

    name = "delta_spark_merge"
    VIEW = "bench_merge_source"

    def __init__(self, root: str) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")
        self.app_id = f"bench-{self.name}-{uuid.uuid4()}"

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        _require_delta_spark(spark, self.name)
        source = latest_per_key(spark.read.parquet(batch_path))
        if not os.path.isdir(os.path.join(self.table_uri, "_delta_log")):
            source.limit(0).write.format("delta").mode("ignore").save(self.table_uri)
        merged = merge_batch(
            spark, self.table_uri, source, view=self.VIEW, app_id=self.app_id, batch_id=batch_id
        )
        return {"merge": merged}

    def analyse(self, info: dict[str, Any]) -> None:
        pass

    def state(self, spark: SparkSession) -> DataFrame:
        return spark.read.format("delta").load(self.table_uri).select("key", "value")


class DeltaSparkAppendSystem:
    """Spark's own Delta append of each batch: what a Delta sink's batch costs at least."""

    name = "delta_spark_append"

    def __init__(self, root: str) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")
        self.app_id = f"bench-{self.name}-{uuid.uuid4()}"

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        _require_delta_spark(spark, self.name)
        (
            spark.read.parquet(batch_path)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(self.table_uri)
        )
        return {}

    def analyse(self, info: dict[str, Any]) -> None:
        pass

    def state(self, spark: SparkSession) -> DataFrame:
        latest = latest_per_key(spark.read.format("delta").load(self.table_uri))
        return latest.filter(F.col("value").isNotNull()).select("key", "value")


def _require_delta_spark(spark: SparkSession, system: str) -> None:
    if not delta_spark_on(spark):
        raise RuntimeError(
            f"{system} needs Spark's own Delta (delta-spark) on the session: run `make jars` "
            "and run the bench on .venv-spark4.2 (`make bench` does both)"
        )


def _read_live(spark: SparkSession, uri: str) -> DataFrame:
    paths = delta_table_size(uri).paths
    if not paths:
        return spark.createDataFrame([], "key string, value binary")
    return spark.read.parquet(*paths).select("key", "value")


def make_system(name: str, root: str, schema: pa.Schema = TABLE_SCHEMA) -> System:
    os.makedirs(root, exist_ok=True)
    if name == "compacted_sink":
        return SinkSystem(root, compact=True)
    if name == "compacted_sink_inline":
        return SinkSystem(root, compact=True, name=name, background=False)
    if name == "compacted_sink_not_niced":
        return SinkSystem(root, compact=True, name=name, nice=0)
    if name == "compacted_sink_dirty_075":
        return SinkSystem(root, compact=True, name=name, dirty_ratio=0.75)
    if name == "compacted_sink_dirty_020":
        return SinkSystem(root, compact=True, name=name, dirty_ratio=0.2)
    if name == "compacted_sink_combined":
        return SinkSystem(root, compact=True, name=name, combine=True)
    if name == "sink_cleaning_off":
        return SinkSystem(root, compact=False)
    if name == "spark_parquet":
        return SparkParquetSystem(root)
    if name == "merge_per_batch":
        return MergeSystem(root, schema)
    if name == "rewrite_per_batch":
        return RewriteSystem(root, schema)
    if name == "delta_spark_merge":
        return DeltaSparkMergeSystem(root)
    if name == "delta_spark_append":
        return DeltaSparkAppendSystem(root)
    known = ", ".join(SYSTEMS + DELTA_SPARK_SYSTEMS + OPTIONAL_SYSTEMS)
    raise ValueError(f"unknown system {name!r}; known: {known}")
