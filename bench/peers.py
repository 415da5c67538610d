"""``python -m bench.peers``: the systems built to keep the latest value per key on a lake,
fed the bench's batches beside the sink.

The peers, one class each, every one fed one batch file at a time as a ``foreachBatch``
hook would feed it (a batch DataFrame and its batch id):

=====================  ==================================================================
system                 settings, and why
=====================  ==================================================================
``paimon_pk``          Apache Paimon primary-key table (``primary-key = key``) in a
                       filesystem catalog under the system's directory.
                       ``merge-engine = deduplicate`` (the latest record of a key wins:
                       Kafka's compaction); ``sequence.field = seq`` (the record's offset
                       orders a key's records, inside a batch too, whatever the write
                       order); ``rowkind.field = row_kind`` (a tombstone is written as a
                       ``-D`` row, which deletes its key: the way a Spark writer says
                       DELETE to Paimon); ``bucket = 2`` (fixed buckets; Paimon's docs
                       advise 200 MB-1 GB a bucket: 1e6 keys x 512 B is about that over
                       2 buckets, and 2 matches the 2 cores); ``file.format = parquet``,
                       ``file.compression = zstd`` (as every other system here); its
                       writer's own compaction on (the default: sorted runs merged when
                       ``num-sorted-run.compaction-trigger`` = 5 is reached, the batch job
                       waiting for it) and ``full-compaction.delta-commits = 10`` (docs:
                       a full compaction every N commits keeps a merge-on-read short).
``hudi_mor``           Apache Hudi merge-on-read table, ``upsert``, record key ``key``,
                       ordering (precombine) field ``seq`` with event-time merging (the
                       higher offset wins, a batch's own duplicates are combined before
                       the write: ``hoodie.combine.before.upsert``, the default), a
                       tombstone written with ``_hoodie_is_deleted = true``;
                       non-partitioned; inline compaction every 5 delta commits
                       (``hoodie.compact.inline``, ``hoodie.compact.inline.max.delta.commits``:
                       the docs' advice for a Spark datasource writer, which cannot run
                       async compaction outside a Hudi streaming sink); metadata table on
                       (the default); no hive sync; zstd Parquet; the Kryo serializer on
                       the session (Hudi's docs require it). Below
                       ``hoodie.parquet.small.file.limit`` (100 MB, the default) a file
                       group is rewritten whole by each batch (no log, no compaction): a
                       small table is copy-on-write in effect.
``delta_spark_merge_dv``  delta-spark ``MERGE INTO`` from foreachBatch as Delta's docs write
                       the upsert (batch deduped in Spark, tombstones deleted), on a table
                       with ``delta.enableDeletionVectors = true``: MERGE marks replaced
                       rows in deletion vectors instead of rewriting their files (what
                       Databricks turns on for new tables). Idempotent through the session's
                       ``txnAppId`` / ``txnVersion``.
=====================  ==================================================================

Idempotency: delta-spark skips a batch id it committed. Paimon and Hudi have no batch-id
check for a batch write; a replayed batch is harmless to their state because a key's
records are ordered by ``seq`` (a replay writes records equal to ones already merged),
except where a full compaction has already dropped a key's delete and its older record
comes again.

Which Spark: Maven Central serves Paimon's Spark connector up to 0.9.0 and only for Spark
3.5 (``paimon-spark-3.5``; no ``paimon-spark-4.x``), and Hudi's Spark bundles only for 3.5
(``hudi-spark3.5-bundle_2.12`` 1.2.0; no Spark 4 bundle), checked 26 November 2026. So
every system runs on pyspark 3.5 (``.venv-peers``, with delta-spark 3.3 for the MERGE
baselines): the peers in one process (the default on a pyspark 3), the sink and its
baselines in others (``--systems``, ``--tag``; the default on a pyspark 4), as
``make bench-peers`` runs them. Each process also reads the expected state straight from
the batch files (latest record per key by ``seq``, tombstones dropped) and every system's
state is checked against it; ``--report`` then checks that the processes' expected states
agree (the same digest) and writes the table.

Measured as ``bench.run`` measures: ingest (the sum of batch wall times, a background
cleaner's drain included), p50/p99 batch (batch 0 left out), bytes written (every file
that appeared or grew under the system's directory: data, logs, metadata), table bytes at
the end, the state read as a Spark DataFrame and counted (rows and an xxhash64 digest of
key and value), and the state read as Arrow without Spark where a library can (delta-rs,
pypaimon, hudi-rs).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.delta_upsert import latest_per_key, merge_batch
from bench.measure import (
    DirectoryMeter,
    TableSize,
    delta_table_size,
    load_average,
    process_tree_cpu_s,
)
from bench.workload import Workload, generate

PEERS = ("paimon_pk", "hudi_mor", "delta_spark_merge_dv")
# What the pyspark-4 process runs: the sink, and the baselines it is usually measured against.
SINK_SIDE = ("compacted_sink", "merge_per_batch", "delta_spark_merge")
JARS = Path(__file__).resolve().parent.parent / ".jars"
JAR_SETS = ("paimon", "hudi", "delta")  # .jars/<set>-<pyspark version>/, from `make jars-peers`
REPLAYS = 2  # the state read, best of two


def _quick(name: str, keys: int, batches: int, records: int, skew: str) -> Workload:
    return Workload(
        name=name,
        keys=keys,
        batches=batches,
        records_per_batch=records,
        skew=skew,  # type: ignore[arg-type]
        record_size="512B",
    )


# Steady state: history >= 4x the live keys. The quick run only proves every system runs
# and ends in the same state.
FULL = (
    _quick("1e6-uniform-512B-peers", 1_000_000, 40, 100_000, "uniform"),
    _quick("1e6-zipf-512B-peers", 1_000_000, 40, 100_000, "zipf"),
)
QUICK = (
    _quick("1e5-uniform-512B-peers-quick", 100_000, 6, 20_000, "uniform"),
    _quick("1e5-zipf-512B-peers-quick", 100_000, 6, 20_000, "zipf"),
)
WARM_UP = _quick("warm-up-512B", 1_000, 3, 1_000, "uniform")

log = logging.getLogger("bench.peers")


# -- the state, as every system is checked ------------------------------------------------


def checksum(df: DataFrame) -> tuple[int, int]:
    """Rows and XOR of xxhash64(key, value) over ``df`` (as ``bench.systems.checksum``)."""
    row = df.agg(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64("key", "value")).alias("x"))
    first = row.collect()[0]
    return int(first["n"]), int(first["x"] or 0)


def expected_state(spark: SparkSession, files: list[str]) -> DataFrame:
    """The state every system must end in, from the batch files: latest per key, live only."""
    latest = latest_per_key(spark.read.parquet(*files))
    return latest.filter(F.col("value").isNotNull()).select("key", "value")


def directory_size(root: str, skip: tuple[str, ...] = ()) -> TableSize:
    """Bytes and files under ``root`` (Hadoop's ``.crc``/``_SUCCESS`` left out), but ``skip``."""
    paths = []
    for directory, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        paths += [
            os.path.join(directory, n) for n in names if not n.endswith(".crc") and n != "_SUCCESS"
        ]
    return TableSize(sum(os.path.getsize(p) for p in paths), len(paths), tuple(sorted(paths)))


# -- the peers -------------------------------------------------------------------------------


class PaimonSystem:
    """A Paimon primary-key table, ``merge-engine = deduplicate`` (module docstring: settings).

    Each batch is appended with a ``row_kind`` column: ``+I`` for a record, ``-D`` for a
    tombstone. Not idempotent by batch id; a replayed batch leaves the state as it was
    (records ordered by ``seq``).
    """

    name = "paimon_pk"
    BUCKETS = 2
    FULL_COMPACTION_DELTA_COMMITS = 10

    def __init__(self, root: str) -> None:
        self.root = root
        self.warehouse = os.path.join(root, "warehouse")
        self.catalog = f"paimon_{uuid.uuid4().hex[:8]}"  # one catalog per warehouse
        self.table = f"{self.catalog}.bench.state"
        self.table_uri = os.path.join(self.warehouse, "bench.db", "state")
        self._spark: SparkSession | None = None

    def _create(self, spark: SparkSession, batch: DataFrame) -> None:
        spark.conf.set(f"spark.sql.catalog.{self.catalog}", "org.apache.paimon.spark.SparkCatalog")
        spark.conf.set(f"spark.sql.catalog.{self.catalog}.warehouse", f"file:{self.warehouse}")
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in batch.schema.fields)
        properties = {
            "primary-key": "key",
            "bucket": str(self.BUCKETS),
            "merge-engine": "deduplicate",
            "sequence.field": "seq",
            "rowkind.field": "row_kind",
            "file.format": "parquet",
            "file.compression": "zstd",
            "full-compaction.delta-commits": str(self.FULL_COMPACTION_DELTA_COMMITS),
        }
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {self.catalog}.bench")
        spark.sql(
            f"CREATE TABLE {self.table} ({columns}, row_kind string) TBLPROPERTIES ("
            + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
            + ")"
        )
        self._spark = spark

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        batch = spark.read.parquet(batch_path)
        if self._spark is None:
            self._create(spark, batch)
        kind = F.when(F.col("value").isNull(), F.lit("-D")).otherwise(F.lit("+I"))
        batch.withColumn("row_kind", kind).writeTo(self.table).append()
        return {}

    def state(self, spark: SparkSession) -> DataFrame:
        return spark.table(self.table).select("key", "value")

    def size(self) -> TableSize:
        """Live data files of the latest snapshot (Paimon's ``$files`` system table)."""
        assert self._spark is not None
        row = self._spark.sql(
            f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS b "
            f"FROM {self.catalog}.bench.`state$files`"
        ).collect()[0]
        return TableSize(int(row["b"]), int(row["n"]), ())

    def describe(self) -> dict[str, Any]:
        """Snapshots by commit kind (APPEND, COMPACT, ...): whether its compaction ran."""
        assert self._spark is not None
        rows = self._spark.sql(
            f"SELECT commit_kind, count(*) AS n FROM {self.catalog}.bench.`state$snapshots` "
            "GROUP BY commit_kind"
        ).collect()
        return {"snapshots_by_kind": {r["commit_kind"]: int(r["n"]) for r in rows}}

    def arrow_state(self) -> Any:
        """The state as Arrow through pypaimon (Paimon's Python reader), no Spark."""
        from pypaimon import CatalogFactory

        catalog = CatalogFactory.create({"warehouse": self.warehouse})
        table = catalog.get_table("bench.state")
        builder = table.new_read_builder().with_projection(["key", "value"])
        return builder.new_read().to_arrow(builder.new_scan().plan().splits())


HUDI_OPTIONS = {
    "hoodie.table.name": "bench_state",
    "hoodie.datasource.write.table.type": "MERGE_ON_READ",
    "hoodie.datasource.write.operation": "upsert",
    "hoodie.datasource.write.recordkey.field": "key",
    "hoodie.datasource.write.precombine.field": "seq",
    "hoodie.table.ordering.fields": "seq",
    "hoodie.record.merge.mode": "EVENT_TIME_ORDERING",
    "hoodie.datasource.write.partitionpath.field": "",
    "hoodie.datasource.write.keygenerator.class": (
        "org.apache.hudi.keygen.NonpartitionedKeyGenerator"
    ),
    "hoodie.compact.inline": "true",
    "hoodie.compact.inline.max.delta.commits": "5",
    "hoodie.datasource.hive_sync.enable": "false",
    "hoodie.parquet.compression.codec": "zstd",
    "hoodie.upsert.shuffle.parallelism": "2",
}


def hudi_latest_slices(table_uri: str) -> TableSize:
    """Bytes and files of the latest file slice of each file group of the Hudi table at
    ``table_uri`` (non-partitioned), from the file names: a base file is
    ``<file id>_<write token>_<instant>.parquet``, a log file
    ``.<file id>_<base instant>.log.<version>_<write token>``."""
    bases: dict[str, tuple[str, str]] = {}
    logs: list[tuple[str, str, str]] = []
    for name in os.listdir(table_uri):
        path = os.path.join(table_uri, name)
        if name.endswith(".parquet"):
            file_id, _token, instant = name[: -len(".parquet")].rsplit("_", 2)
            if file_id not in bases or instant > bases[file_id][0]:
                bases[file_id] = (instant, path)
        elif name.startswith(".") and ".log." in name:
            file_id, base_instant = name[1:].split(".log.", 1)[0].rsplit("_", 1)
            logs.append((file_id, base_instant, path))
    paths = [path for _instant, path in bases.values()]
    paths += [p for f, i, p in logs if f not in bases or bases[f][0] == i]
    return TableSize(sum(os.path.getsize(p) for p in paths), len(paths), tuple(sorted(paths)))


class HudiMorSystem:
    """A Hudi merge-on-read table, upserted (module docstring: settings).

    A tombstone is written with ``_hoodie_is_deleted = true``. Not idempotent by batch
    id; a replayed batch leaves the state as it was (event-time ordering on ``seq``).
    """

    name = "hudi_mor"

    def __init__(self, root: str) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        batch = spark.read.parquet(batch_path)
        (
            batch.withColumn("_hoodie_is_deleted", F.col("value").isNull())
            .write.format("hudi")
            .options(**HUDI_OPTIONS)
            .mode("append")
            .save(self.table_uri)
        )
        return {}

    def state(self, spark: SparkSession) -> DataFrame:
        return spark.read.format("hudi").load(self.table_uri).select("key", "value")

    def size(self) -> TableSize:
        """The latest file slice of every file group: its newest base file and the log files
        written against that base (older slices, which Hudi's cleaner retains for
        ``hoodie.cleaner.commits.retained`` commits, and ``.hoodie`` left out)."""
        return hudi_latest_slices(self.table_uri)

    def describe(self) -> dict[str, Any]:
        """Instants on the timeline by action (deltacommit, commit = a compaction, clean)."""
        timeline = os.path.join(self.table_uri, ".hoodie", "timeline")
        if not os.path.isdir(timeline):
            timeline = os.path.join(self.table_uri, ".hoodie")
        actions: dict[str, int] = {}
        for name in os.listdir(timeline):
            action = name.rsplit(".", 1)[-1]
            if name[:1].isdigit() and action not in ("requested", "inflight", "crc"):
                actions[action] = actions.get(action, 0) + 1
        return {"timeline_completed": actions}

    def arrow_state(self) -> Any:
        """The state as Arrow through hudi-rs (Hudi's native reader), no Spark."""
        from hudi import HudiTableBuilder

        table = HudiTableBuilder.from_base_uri(self.table_uri).build()
        return pa.Table.from_batches(table.read()).select(["key", "value"])


class DeltaMergeDvSystem:
    """foreachBatch + delta-spark ``MERGE INTO`` on a table with deletion vectors on.

    The same MERGE as ``bench.systems.DeltaSparkMergeSystem``; the table is created empty
    with ``delta.enableDeletionVectors = true`` before the first batch. Idempotent: a
    batch id already committed under the system's app id commits nothing.
    """

    name = "delta_spark_merge_dv"
    VIEW = "bench_peers_merge_source"

    def __init__(self, root: str) -> None:
        self.root = root
        self.table_uri = os.path.join(root, "table")
        self.app_id = f"bench-{self.name}-{uuid.uuid4()}"

    def ingest(self, spark: SparkSession, batch_id: int, batch_path: str) -> dict[str, Any]:
        source = latest_per_key(spark.read.parquet(batch_path))
        if not os.path.isdir(os.path.join(self.table_uri, "_delta_log")):
            source.limit(0).write.format("delta").save(self.table_uri)
            spark.sql(
                f"ALTER TABLE delta.`{self.table_uri}` "
                "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
            )
        merged = merge_batch(
            spark, self.table_uri, source, view=self.VIEW, app_id=self.app_id, batch_id=batch_id
        )
        return {"merge": merged}

    def state(self, spark: SparkSession) -> DataFrame:
        return spark.read.format("delta").load(self.table_uri).select("key", "value")

    def size(self) -> TableSize:
        """Live data files (delta-rs reads the log), their deletion vectors left out."""
        return delta_table_size(self.table_uri)

    def describe(self) -> dict[str, Any]:
        """Deletion-vector files on storage, live data files, and the table's reader features."""
        from deltalake import DeltaTable

        table = DeltaTable(self.table_uri)
        return {
            "deletion_vector_files": len(
                glob.glob(os.path.join(self.table_uri, "deletion_vector_*.bin"))
            ),
            "live_files": len(table.file_uris()),
            "reader_features": list(table.protocol().reader_features or []),
        }

    def arrow_state(self) -> Any:
        """The state as Arrow through delta-rs's query engine (deletion vectors applied)."""
        from deltalake import DeltaTable, QueryBuilder

        query = QueryBuilder().register("state", DeltaTable(self.table_uri))
        return pa.table(query.execute("SELECT key, value FROM state").read_all())


def make_peer(name: str, root: str, schema: pa.Schema) -> Any:
    """A peer by name, or (on pyspark 4) one of ``bench.systems``'s systems (``schema``:
    the batches' Arrow schema, which delta-rs's MERGE table is created with)."""
    os.makedirs(root, exist_ok=True)
    if name == "paimon_pk":
        return PaimonSystem(root)
    if name == "hudi_mor":
        return HudiMorSystem(root)
    if name == "delta_spark_merge_dv":
        return DeltaMergeDvSystem(root)
    from bench.systems import make_system  # the sink's side

    return make_system(name, root, schema)


# -- running -----------------------------------------------------------------------------


def _size(system: Any) -> TableSize:
    size = getattr(system, "size", None)
    return size() if size else delta_table_size(system.table_uri)


def run_system(
    spark: SparkSession,
    name: str,
    files: list[str],
    root: str,
    schema: pa.Schema,
    make: Callable[[str, str, pa.Schema], Any] = make_peer,
    read_during: tuple[int, set[tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """Feed every batch file to one system; measure as ``bench.run.run_system`` does.

    Returns ingest (wall and CPU seconds of this process and its descendants: the JVM,
    its Python workers), p50/p99 batch (batch 0 left out), bytes written, table bytes and
    files at the end, the state read (DataFrame, counted; best of two), the state as
    Arrow without Spark where the system has a reader (or the error it raised), and
    the per-batch seconds, CPU seconds and bytes. With ``read_during`` = (batch, states)
    the state is also read from a second thread while that batch is written, and its
    (rows, digest) checked to be one of ``states`` (the state before or after the batch);
    that batch is left out of p50/p99, and the read's CPU is in the ingest's (a few
    seconds against minutes). The directory ``root`` is emptied first.
    """
    shutil.rmtree(root, ignore_errors=True)
    system = make(name, root, schema)
    meter = DirectoryMeter(root)
    per_batch, written = [], 0
    during: dict[str, Any] | None = None
    for batch_id, path in enumerate(files):
        reader = None
        if read_during is not None and batch_id == read_during[0]:
            reader = _StateReadWhileWriting(spark, system, read_during[1])
        cpu_before, started = process_tree_cpu_s(), time.perf_counter()
        info = system.ingest(spark, batch_id, path)
        elapsed = time.perf_counter() - started
        if reader is not None:
            during = reader.result()
        cpu = process_tree_cpu_s() - cpu_before
        batch_written = meter.written()
        written += batch_written
        analyse = getattr(system, "analyse", None)
        if analyse:
            analyse(info)
        per_batch.append(
            {"batch": batch_id, "s": elapsed, "cpu_s": cpu, "bytes_written": batch_written}
        )
        log.info(
            "%s batch %d: %.2f s (%.1f CPU s), %.1f MB written",
            name,
            batch_id,
            elapsed,
            cpu,
            batch_written / 1e6,
        )
    finish = getattr(system, "finish", None)
    cpu_before = process_tree_cpu_s()
    drain_s = finish() if finish else 0.0
    drain_cpu_s = process_tree_cpu_s() - cpu_before
    written += meter.written()
    size = _size(system)
    reads, rows, digest = [], 0, 0
    for _ in range(REPLAYS):
        started = time.perf_counter()
        rows, digest = checksum(system.state(spark))
        reads.append(time.perf_counter() - started)
    result: dict[str, Any] = {
        "ingest_s": sum(b["s"] for b in per_batch) + drain_s,
        "ingest_cpu_s": sum(b["cpu_s"] for b in per_batch) + drain_cpu_s,
        "drain_s": drain_s,
        "bytes_written": written,
        "table_bytes": size.bytes,
        "files": size.files,
        "state_read_s": min(reads),
        "state_read_runs_s": reads,
        "live_keys": rows,
        "state_checksum": digest,
    }
    if during is not None:
        result["read_while_writing"] = during
    beside = read_during[0] if read_during is not None else None
    latencies = [b["s"] for b in per_batch[1:] if b["batch"] != beside] or [
        b["s"] for b in per_batch
    ]
    result["p50_batch_s"] = float(np.percentile(latencies, 50))
    result["p99_batch_s"] = float(np.percentile(latencies, 99))
    arrow_state = _arrow_reader(system)
    if arrow_state:
        result["arrow_read"] = _arrow_read(arrow_state)
    if hasattr(system, "describe"):
        try:
            result["describe"] = system.describe()
        except Exception as e:  # a description is informative only
            result["describe"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    close = getattr(system, "close", None)
    if close:
        close()
    result["per_batch"] = per_batch
    log.info(
        "%s: ingest %.1f s, state read %.2f s, %d live keys",
        name,
        result["ingest_s"],
        min(reads),
        rows,
    )
    return result


class _StateReadWhileWriting:
    """The state read (DataFrame, counted) on a second thread, started before a batch is
    written: what a reader sees of a table while its writer commits. The CPU it takes is
    counted in that batch's (one process); its wall time is its own."""

    def __init__(self, spark: SparkSession, system: Any, consistent: set[tuple[int, int]]) -> None:
        self._consistent = consistent
        self._answer: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._read, args=(spark, system), daemon=True)
        self._thread.start()

    def _read(self, spark: SparkSession, system: Any) -> None:
        started = time.perf_counter()
        try:
            rows, digest = checksum(system.state(spark))
        except Exception as e:  # a reader that fails beside a writer is a finding
            self._answer = {"error": f"{type(e).__name__}: {e}"[:400]}
            return
        self._answer = {
            "s": time.perf_counter() - started,
            "rows": rows,
            "consistent": (rows, digest) in self._consistent,
        }

    def result(self) -> dict[str, Any]:
        self._thread.join()
        return self._answer


def _arrow_reader(system: Any) -> Callable[[], Any] | None:
    """How to read ``system``'s state as Arrow without Spark, if anything can: the peer's
    own reader, the sink's ``read_state``, delta-rs for a delta-rs MERGE table."""
    if hasattr(system, "arrow_state"):
        return system.arrow_state
    if system.name.startswith("compacted_sink"):
        from sinks import read_state

        return lambda: read_state(system.table_uri)
    if system.name == "merge_per_batch":
        from deltalake import DeltaTable

        return lambda: DeltaTable(system.table_uri).to_pyarrow_table(columns=["key", "value"])
    return None


def _arrow_read(arrow_state: Callable[[], Any]) -> dict[str, Any]:
    """Seconds and rows of an Arrow read, or the error it raised (a library that cannot
    read the table is a finding, not a failure of the run)."""
    started = time.perf_counter()
    try:
        table = arrow_state()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:400]}
    return {"s": time.perf_counter() - started, "rows": table.num_rows}


def session() -> SparkSession:
    """pyspark 3.5 with Paimon, Hudi and delta-spark from ``.jars`` (the peers); on pyspark
    4 the bench's own session (``bench.session``: delta-spark 4.4 when fetched)."""
    import pyspark

    if not pyspark.__version__.startswith("3."):
        from bench.session import bench_session

        return bench_session()
    jars = []
    for name in JAR_SETS:
        directory = JARS / f"{name}-{pyspark.__version__}"
        if not (directory / ".fetched").exists():
            raise FileNotFoundError(
                f"{directory} has not been fetched: run `make jars-peers` (the peers' jars for "
                f"pyspark {pyspark.__version__})"
            )
        jars += sorted(str(p) for p in directory.glob("*.jar"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": ",".join(
            (
                "io.delta.sql.DeltaSparkSessionExtension",
                "org.apache.spark.sql.hudi.HoodieSparkSessionExtension",
                "org.apache.paimon.spark.extensions.PaimonSparkSessionExtensions",
            )
        ),
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.kryo.registrator": "org.apache.spark.HoodieSparkKryoRegistrar",
        # as bench.session's
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.driver.memory": "3g",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    builder = SparkSession.builder.master("local[2]").appName("compacted-sink-bench-peers")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _versions(spark: SparkSession) -> dict[str, str]:
    found = {"spark": spark.version}
    for package in ("pyspark", "delta-spark", "deltalake", "pyarrow", "pypaimon", "hudi"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    import pyspark

    for name in JAR_SETS:
        for jar in sorted((JARS / f"{name}-{pyspark.__version__}").glob("*.jar")):
            if jar.name.startswith(("paimon-spark", "hudi-spark", "delta-spark")):
                found[jar.stem.rsplit("-", 1)[0]] = jar.stem.rsplit("-", 1)[1]
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every system of ``args.systems`` on every workload, in this process's pyspark."""
    workloads = QUICK if args.quick else FULL
    if args.batches:
        workloads = tuple(dataclasses.replace(w, batches=args.batches) for w in workloads)
    systems = tuple(args.systems.split(","))
    work = args.work or tempfile.mkdtemp(prefix="compacted-sink-peers-")
    spark = session()
    started = time.perf_counter()
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "versions": _versions(spark),
        "load_before": load_average(),
        "workloads": [],
        "notes": list(args.note),
        "tag": args.tag,
    }
    try:
        warm = generate(WARM_UP, os.path.join(work, "input", WARM_UP.name))
        for name in systems:  # no system pays the JVM's warm-up in the measured run
            run_system(spark, name, warm, os.path.join(work, WARM_UP.name, name), WARM_UP.schema)
        shutil.rmtree(os.path.join(work, WARM_UP.name), ignore_errors=True)
        for workload in workloads:
            files = generate(workload, os.path.join(work, "input", workload.name))
            rows, digest = checksum(expected_state(spark, files))
            middle = len(files) // 2
            read_during = None
            if middle >= 1:
                around = {checksum(expected_state(spark, files[:n])) for n in (middle, middle + 1)}
                read_during = (middle, around)
            entry: dict[str, Any] = {
                **{k: v for k, v in dataclasses.asdict(workload).items() if k != "systems"},
                "input_bytes": sum(os.path.getsize(f) for f in files),
                "expected": {"live_keys": rows, "state_checksum": digest},
                "systems": {},
            }
            results["workloads"].append(entry)
            for name in systems:
                root = os.path.join(work, workload.name, name)
                result = run_system(
                    spark, name, files, root, workload.schema, read_during=read_during
                )
                result["state_agrees"] = (result["live_keys"], result["state_checksum"]) == (
                    rows,
                    digest,
                )
                entry["systems"][name] = result
                shutil.rmtree(root, ignore_errors=True)
                _dump(results, args.out, started)  # a run cut short still leaves its figures
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    _dump(results, args.out, started)
    return results


def _dump(results: dict[str, Any], out: str, started: float) -> None:
    import pyspark

    results["load_after"] = load_average()
    results["total_s"] = time.perf_counter() - started
    results["generated_utc"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    os.makedirs(out, exist_ok=True)
    tag = f"-{results['tag']}" if results.get("tag") else ""
    with open(os.path.join(out, f"peers-pyspark{pyspark.__version__}{tag}.json"), "w") as f:
        json.dump(results, f, indent=1)


# -- the report: both processes' files in one table ---------------------------------------

ORDER = (
    "compacted_sink",
    "paimon_pk",
    "hudi_mor",
    "delta_spark_merge_dv",
    "delta_spark_merge",
    "merge_per_batch",
)


def report(out: str) -> str:
    """Merge ``out/peers-pyspark*.json`` into ``out/results.json`` and ``out/PEERS.md``.

    Returns the Markdown. Per workload, the processes' expected states must agree
    (same rows and digest: the same batches, the same hash), and every system's state
    must equal it. A system run by more than one file is reported from the newest run
    (``generated_utc``): a rerun of some systems updates their rows and keeps the rest.
    """
    runs = []
    for path in sorted(glob.glob(os.path.join(out, "peers-pyspark*.json"))):
        with open(path) as f:
            runs.append({**json.load(f), "file": os.path.basename(path)})
    runs.sort(key=lambda r: r.get("generated_utc", ""))  # stable: the newest is merged last
    if not runs:
        raise FileNotFoundError(f"no peers-pyspark*.json under {out}: run the peers first")
    merged: dict[str, dict[str, Any]] = {}
    for one in runs:
        spark = one["versions"]["spark"]
        for w in one["workloads"]:
            entry = merged.setdefault(
                w["name"],
                {
                    **{k: v for k, v in w.items() if k != "systems"},
                    "expected_by_process": {},
                    "systems": {},
                },
            )
            entry["expected_by_process"][one["file"]] = w["expected"]
            for name, result in w["systems"].items():
                entry["systems"][name] = {**result, "spark": spark}
    for entry in merged.values():
        expected = {tuple(e.values()) for e in entry["expected_by_process"].values()}
        entry["expected_states_agree"] = len(expected) == 1
        entry["all_states_agree"] = entry["expected_states_agree"] and all(
            s["state_agrees"] for s in entry["systems"].values()
        )
    combined = {
        "runs": [{k: v for k, v in r.items() if k != "workloads"} for r in runs],
        "workloads": list(merged.values()),
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(combined, f, indent=1)
    text = markdown(combined)
    with open(os.path.join(out, "PEERS.md"), "w") as f:
        f.write(text)
    plot(combined, os.path.join(out, "peers.png"))
    return text


def markdown(combined: dict[str, Any]) -> str:
    lines = ["# The sink against its peers", ""]
    for r in combined["runs"]:
        lines.append(
            f"- {r['mode']} run on Spark {r['versions']['spark']}, {r['generated_utc']}, "
            f"{r['total_s'] / 60:.1f} min; versions: "
            + ", ".join(f"{k} {v}" for k, v in r["versions"].items() if k != "spark")
        )
        lines.append(f"  - load before: `{r['load_before']}`; after: `{r['load_after']}`")
        lines += [f"  - note: {n}" for n in r.get("notes", [])]
    for w in combined["workloads"]:
        lines += [
            "",
            f"## {w['name']}: {w['keys']:,} keys, {w['batches']} x {w['records_per_batch']:,} "
            f"records, {w['skew']}; input {w['input_bytes'] / 1e6:.0f} MB",
            "",
            f"Expected state: {next(iter(w['expected_by_process'].values()))['live_keys']:,} live "
            f"keys; every process read the same expected state: "
            f"{'yes' if w['expected_states_agree'] else '**NO**'}; every system ends in it: "
            f"{'yes' if w['all_states_agree'] else '**NO**'}",
            "",
            "| system | Spark | ingest s | ingest CPU s | p50 batch s | p99 batch s | written MB "
            "| table MB (files) | state read s (Spark) | state read s (Arrow, no Spark) "
            "| state read s while writing | state agrees |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        names = sorted(w["systems"], key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
        for name in names:
            s = w["systems"][name]
            arrow = s.get("arrow_read")
            arrow_text = "—"
            if arrow and "s" in arrow:
                arrow_text = f"{arrow['s']:.2f} ({arrow['rows']:,} rows)"
            elif arrow:
                arrow_text = "fails: " + arrow["error"].split("\n")[0][:80]
            cpu = s.get("ingest_cpu_s")
            lines.append(
                f"| {name} | {s['spark']} | {s['ingest_s']:.1f} | "
                f"{'—' if cpu is None else f'{cpu:.0f}'} | {s['p50_batch_s']:.2f} | "
                f"{s['p99_batch_s']:.2f} | {s['bytes_written'] / 1e6:.0f} | "
                f"{s['table_bytes'] / 1e6:.0f} ({s['files']}) | {s['state_read_s']:.2f} | "
                f"{arrow_text} | {_while_writing(s.get('read_while_writing'))} | "
                f"{'yes' if s['state_agrees'] else '**NO**'} |"
            )
        lines += goals(w["systems"])
        described = {n: w["systems"][n]["describe"] for n in names if "describe" in w["systems"][n]}
        if described:
            lines += ["", "What each peer's table holds at the end:", ""]
            lines += [f"- {n}: `{json.dumps(d)}`" for n, d in described.items()]
    return "\n".join(lines) + "\n"


def _while_writing(read: dict[str, Any] | None) -> str:
    if not read:
        return "—"
    if "error" in read:
        return "fails: " + read["error"].split("\n")[0][:60]
    return f"{read['s']:.2f}" + ("" if read["consistent"] else " (**inconsistent**)")


# What the sink is held to against each system (ingest and bytes: the sink's figure over
# the peer's; the state read: the sink's over the peer's), from the goals.
GOAL_PEERS = ("paimon_pk", "hudi_mor", "delta_spark_merge_dv", "merge_per_batch")
COPY_ON_WRITE = "delta_spark_merge"


def goals(systems: dict[str, Any]) -> list[str]:
    """The goals table: for each peer, the sink's ingest (wall and CPU), state read and bytes
    written against the peer's, each met or not; bytes against copy-on-write MERGE >= 3x
    fewer."""
    sink = systems.get("compacted_sink")
    if sink is None:
        return []
    lines = [
        "",
        "Goals (the sink against each peer; met when the ratio is at least 1):",
        "",
        "| peer | ingest: peer s / sink s | ingest CPU: peer / sink | state read (Spark): "
        "peer s / sink s | bytes written: peer / sink |",
        "|---|---|---|---|---|",
    ]

    def ratio(peer: float | None, mine: float | None, want: float = 1.0) -> str:
        if not peer or not mine:
            return "—"
        r = peer / mine
        return f"{r:.2f}x {'met' if r >= want else '**not met**'}"

    for name in (*GOAL_PEERS, COPY_ON_WRITE):
        peer = systems.get(name)
        if peer is None:
            continue
        want_bytes = 3.0 if name == COPY_ON_WRITE else 1.0
        lines.append(
            f"| {name} | {ratio(peer['ingest_s'], sink['ingest_s'])} | "
            f"{ratio(peer.get('ingest_cpu_s'), sink.get('ingest_cpu_s'))} | "
            f"{ratio(peer['state_read_s'], sink['state_read_s'])} | "
            f"{ratio(peer['bytes_written'], sink['bytes_written'], want_bytes)}"
            f"{' (goal 3x)' if name == COPY_ON_WRITE else ''} |"
        )
    return lines


def plot(combined: dict[str, Any], path: str) -> None:
    """Per workload: batch wall time and cumulative bytes written, over the batches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = combined["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 8), squeeze=False)
    for column, w in enumerate(workloads):
        times, sizes = axes[0][column], axes[1][column]
        for name in sorted(w["systems"], key=lambda n: ORDER.index(n) if n in ORDER else 99):
            batches = w["systems"][name]["per_batch"]
            n = [b["batch"] for b in batches]
            times.plot(n[1:], [b["s"] for b in batches[1:]], marker=".", label=name)
            sizes.plot(n, np.cumsum([b["bytes_written"] for b in batches]) / 1e6, label=name)
        times.set_title(w["name"])
        times.set_ylabel("batch wall time (s)")
        sizes.set_ylabel("bytes written, cumulative (MB)")
        for ax in (times, sizes):
            ax.set_xlabel("batch")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1e5 keys, 6 batches of 20,000")
    parser.add_argument("--out", default="bench/peers", help="where the results go")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--systems", default=None, help="comma-separated (default: this Spark's)")
    parser.add_argument("--batches", type=int, default=None, help="override every batch count")
    parser.add_argument("--note", action="append", default=[], help="a note for the report")
    parser.add_argument(
        "--tag", default="", help="added to the result file's name: two runs on one pyspark"
    )
    parser.add_argument(
        "--report", action="store_true", help="only merge the processes' files into PEERS.md"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("compacted_sink").setLevel(logging.WARNING)
    if args.report:
        print(report(args.out))
        return 0
    if args.systems is None:
        import pyspark

        args.systems = ",".join(PEERS if pyspark.__version__.startswith("3.") else SINK_SIDE)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
