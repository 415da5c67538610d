"""Where the sink's state read goes at the end of the steady-state run.

``python -m bench.state_read_profile [--quick] [--out bench/peers]`` feeds the sink the
peers run's uniform workload (1e6 keys x 512 B, 40 batches of 100,000; ``--quick``: 1e5
keys, 6 of 20,000) as ``make bench-peers`` does, then reads the state four ways, each
counted with the peers run's checksum (rows and an xxhash64 of key and value):

1. ``sink.state()`` as the run leaves the log (its dirty tail deduped at read time);
2. Spark's plain Parquet read of the same live files (no dedupe: the scan's floor);
3. ``sink.state()`` after a forced pass (nothing dirty left);
4. Spark's plain read of the live files after that pass.

Each read is timed (best of two) with the process tree's CPU seconds, and the last
execution's plan, operator metrics and stage times are kept (``bench.scale``'s
``last_execution_profile``). Results go to ``<out>/state_read_profile.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.measure import load_average, process_tree_cpu_s
from bench.peers import FULL, QUICK, checksum, expected_state, session
from bench.scale import last_execution_profile
from bench.systems import SinkSystem
from bench.workload import generate

log = logging.getLogger("bench.state_read_profile")
READS = 2


def timed_read(spark: SparkSession, make: Any) -> dict[str, Any]:
    """Best of ``READS`` counted reads of ``make()`` (a DataFrame), with its CPU seconds and
    the best run's profile."""
    best: dict[str, Any] | None = None
    for _ in range(READS):
        cpu, started = process_tree_cpu_s(), time.perf_counter()
        rows, digest = checksum(make())
        run = {
            "s": time.perf_counter() - started,
            "cpu_s": process_tree_cpu_s() - cpu,
            "rows": rows,
            "digest": digest,
        }
        if best is None or run["s"] < best["s"]:
            best = {**run, "profile": last_execution_profile(spark)}
    assert best is not None
    return best


def reads(spark: SparkSession, sink: SinkSystem) -> dict[str, Any]:
    """The log's live files as they are, `state()` over them and Spark's plain read of them."""
    data = sink.sink.log_table.snapshot().data_files()
    paths = [os.path.join(sink.table_uri, f.path) for f in data]
    plain: DataFrame = spark.read.parquet(*paths).select("key", "value")
    return {
        "files": len(data),
        "records": sum(f.num_records for f in data),
        "bytes": sum(f.size_bytes for f in data),
        "state": timed_read(spark, sink.sink.state),
        "plain_read": timed_read(spark, lambda: plain),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workload = (QUICK if args.quick else FULL)[0]  # the uniform one
    work = args.work or tempfile.mkdtemp(prefix="compacted-sink-state-profile-")
    spark = session()
    result: dict[str, Any] = {"workload": workload.name, "load_before": load_average()}
    try:
        files = generate(workload, os.path.join(work, "input", workload.name))
        result["expected"] = checksum(expected_state(spark, files))
        sink = SinkSystem(os.path.join(work, "sink"), compact=True)
        cpu, started = process_tree_cpu_s(), time.perf_counter()
        for batch_id, path in enumerate(files):
            sink.ingest(spark, batch_id, path)
        sink.finish()
        result["ingest"] = {"s": time.perf_counter() - started, "cpu_s": process_tree_cpu_s() - cpu}
        result["as_left"] = reads(spark, sink)
        log.info("as left: %s", {k: v for k, v in result["as_left"].items() if k != "state"})
        cpu, started = process_tree_cpu_s(), time.perf_counter()
        stats = sink.sink.clean(force=True)
        result["forced_pass"] = {
            "s": time.perf_counter() - started,
            "cpu_s": process_tree_cpu_s() - cpu,
            "records_read": stats.records_read if stats else 0,
        }
        result["after_pass"] = reads(spark, sink)
        sink.close()
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = load_average()
    return result


def text(result: dict[str, Any]) -> str:
    lines = [
        f"{result['workload']}: load before {result['load_before']}, after {result['load_after']}",
        f"ingest {result['ingest']}",
    ]
    for stage in ("as_left", "after_pass"):
        r = result[stage]
        lines.append(
            f"\n== {stage}: {r['files']} files, {r['records']:,} records, {r['bytes'] / 1e6:.0f} MB"
        )
        for read in ("state", "plain_read"):
            x = r[read]
            lines.append(
                f"-- {read}: {x['s']:.2f} s, {x['cpu_s']:.1f} CPU s, {x['rows']:,} rows\n"
                f"{x['profile']}"
            )
        if stage == "as_left":
            lines.append(f"\n== forced pass: {result['forced_pass']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_read_profile")
    parser.add_argument("--quick", action="store_true", help="1e5 keys, 6 batches of 20,000")
    parser.add_argument("--out", default="bench/peers", help="where the results go")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("compacted_sink").setLevel(logging.WARNING)
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "state_read_profile.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "state_read_profile.txt"), "w") as f:
        f.write(text(result))
    print(text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
