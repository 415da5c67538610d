"""One sink workload, run alike in the test process (local Spark) and as a cluster driver.

As a script it is the driver of the cluster test: it connects to a standalone
master, runs the workload on a table given by a path *relative to its own working
directory*, and writes the outcome as JSON. The test imports `run_workload` and
runs the same workload on its local session, then compares the two outcomes.

The workload appends several keyed batches with tombstones over two partitions,
replays one batch id (skipped: exactly once), forces a pass (which keeps the
last batch's tombstones and stamps their delete horizon), moves the clock past
``delete.retention.ms`` and forces another pass, which drops them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

BATCHES = 3
KEYS = 40
PARTITIONS = 2
START_MS = 1_700_000_000_000
DELETE_RETENTION_MS = 1_000
SINK_ID = "cluster-workload"


class _Clock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


def batch_rows(batch_id: int) -> list[tuple[str, str | None, int]]:
    """Every key once per batch; after the first, every fifth key (shifted) is a tombstone.

    The last batch's tombstones are the latest records of their keys: the first
    forced pass keeps (and stamps) them, the pass after the delete horizon drops them.
    """
    rows = []
    for i in range(KEYS):
        tombstone = batch_id > 0 and (i + batch_id) % 5 == 0
        value = None if tombstone else f"v{batch_id}-{i}"
        rows.append((f"k{i:03d}", value, i % PARTITIONS))
    return rows


def run_workload(spark: Any, table: str) -> dict[str, Any]:
    """Run the workload on ``table`` and describe the outcome (JSON-ready)."""
    from sinks import CleanerConfig, CompactedStateSink

    clock = _Clock()
    sink = CompactedStateSink(
        table,
        config=CleanerConfig(
            # 1.0: the hook never cleans, so the two forced passes do all the cleaning
            # (keeping the test within its time budget on two cores).
            min_cleanable_dirty_ratio=1.0,
            delete_retention_ms=DELETE_RETENTION_MS,
        ),
        sink_id=SINK_ID,
        clock=clock,
    )
    timings: dict[str, float] = {}
    started = time.monotonic()
    for batch_id in range(BATCHES):
        df = spark.createDataFrame(batch_rows(batch_id), "key string, value string, partition int")
        sink(df, batch_id)
        clock.now += 100
    timings["append_s"] = time.monotonic() - started

    mark = time.monotonic()
    sink(spark.createDataFrame(batch_rows(1), "key string, value string, partition int"), 1)
    timings["replayed_batch_s"] = time.monotonic() - mark
    replay_skipped = sink.last_append is not None and sink.last_append.skipped

    mark = time.monotonic()
    first = sink.clean(force=True)
    clock.now += DELETE_RETENTION_MS + 1
    second = sink.clean(force=True)
    timings["clean_s"] = time.monotonic() - mark

    mark = time.monotonic()
    state = sorted(tuple(r) for r in sink.state().collect())
    log = sorted(
        (r["partition"], r["offset"], r["key"], r["value"] is None)
        for r in sink.log().select("partition", "offset", "key", "value").collect()
    )
    timings["read_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started

    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    return {
        "table": sink.path,
        "state": state,
        "log": log,
        "log_end_offsets": {str(p): o for p, o in snapshot.log_end_offsets().items()},
        "files": sorted(s.path for s in snapshot.all_segments()),
        "delta_version": snapshot.version,
        "passes": [s is not None for s in (first, second)],
        "replay_skipped": replay_skipped,
        "records_appended": BATCHES * KEYS,
        "timings": timings,
    }


def describe_executors(spark: Any) -> dict[str, Any]:
    """Where this application's Python tasks ran: process ids, working dirs, executor ids."""
    import pyarrow as pa

    def probe(batches):  # runs in an executor's Python worker
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [{"pid": os.getpid(), "cwd": os.getcwd(), "host": socket.gethostname()}]
        )

    rows = (
        spark.range(0, 4, numPartitions=4)
        .mapInArrow(probe, "pid long, cwd string, host string")
        .collect()
    )
    ids = spark.sparkContext._jsc.sc().getExecutorIds().mkString(",")  # a Scala Seq
    return {
        "driver_pid": os.getpid(),
        "driver_cwd": os.getcwd(),
        "python_workers": sorted({(r["pid"], r["cwd"]) for r in rows}),
        "executor_ids": sorted(i for i in ids.split(",") if i),
    }


def cluster_session(master: str, app_name: str) -> Any:
    """A driver for a standalone master on loopback, configured like the tests' local session."""
    from streaming.jobs.session import local_session

    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.executor.cores": "1",
        "spark.cores.max": "1",
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if os.environ.get("SPARK_DAEMON_JAVA_OPTS"):  # the tests' JVM options (tests/conftest.py)
        conf["spark.executor.extraJavaOptions"] = os.environ["SPARK_DAEMON_JAVA_OPTS"]
    return local_session(app_name, master, conf=conf)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True)
    parser.add_argument("--table", required=True, help="table path, relative to the cwd")
    parser.add_argument("--out", required=True, help="where to write the outcome (JSON)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    spark = cluster_session(args.master, "compacted-sink-cluster-test")
    session_s = time.monotonic() - started
    try:
        outcome = run_workload(spark, args.table)
        outcome["executors"] = describe_executors(spark)
        outcome["master"] = spark.sparkContext.master
    finally:
        spark.stop()
    outcome["timings"]["session_start_s"] = session_s
    with open(args.out, "w") as f:
        json.dump(outcome, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
