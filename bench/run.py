"""``python -m bench.run [--quick] [--out DIR]``: every system on every workload, then the cleaner.

Writes ``DIR/results.json``, ``DIR/RESULTS.md`` and ``DIR/per_batch_cost.png``.
Systems run one after another on each workload, in one process and one
SparkSession; each starts with an empty directory. Scratch data goes to
``--work`` (default: a temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from bench import cleaner_bench, report
from bench.measure import (
    DirectoryMeter,
    PeakRss,
    delta_table_size,
    load_average,
    machine_description,
)
from bench.session import bench_session
from bench.systems import DELTA_SPARK_SYSTEMS, SYSTEMS, checksum, make_system
from bench.workload import BATCH_SCHEMA, Skew, Workload, generate

# The full run (issues #33 and #34): the sink beside the baselines users write, side by
# side in one run on the same CDC-like 512-byte batches: delta-spark MERGE INTO from
# foreachBatch, delta-rs MERGE fed from Spark (toArrow), Spark's own Delta append (the
# append floor) and Spark's plain Parquet write. At 200,000 keys, 10 batches of 50,000
# (#33 measured 12); at 1e6 keys, 8 batches of 100,000. Sized to finish in about 40
# minutes on 2 shared cores: delta-spark's MERGE rewrites every file a batch touches,
# ~20 s a batch at 1e6 keys on a loaded 2-core machine. The earlier workloads (80
# batches at 1e6 x 512 B, the 35 B ones, 5e6 keys) stay selectable with ``--workloads``
# and run the systems they ran before.
_NO_REWRITE = (
    "compacted_sink",
    "compacted_sink_not_niced",
    "merge_per_batch",
    "sink_cleaning_off",
    "spark_parquet",
)
BASELINES = (
    "compacted_sink",
    "delta_spark_merge",
    "merge_per_batch",
    "delta_spark_append",
    "spark_parquet",
)
# The sink with log.cleaner.nice 0 runs beside the default one: what the niced pass buys.
# It runs first, the default sink second: a drift over the run would favour the first.
DEFAULT_SYSTEMS = ("compacted_sink_not_niced", *SYSTEMS, *DELTA_SPARK_SYSTEMS)


def _baseline(
    name: str, keys: int, batches: int, records: int, skew: Skew, extra: tuple[str, ...] = ()
) -> Workload:
    return Workload(
        name=name,
        keys=keys,
        batches=batches,
        records_per_batch=records,
        skew=skew,
        record_size="512B",
        systems=(*BASELINES, *extra),
    )


BASELINE_WORKLOADS = (
    _baseline("2e5-uniform-512B-baselines", 200_000, 10, 50_000, "uniform"),
    _baseline("2e5-zipf-512B-baselines", 200_000, 10, 50_000, "zipf"),
    _baseline("1e6-uniform-512B-baselines", 1_000_000, 8, 100_000, "uniform"),
    # With --systems naming it, the sink at dirty ratio 0.75 beside the others (Zipf only).
    _baseline(
        "1e6-zipf-512B-baselines", 1_000_000, 8, 100_000, "zipf", ("compacted_sink_dirty_075",)
    ),
)
ALL = (
    *BASELINE_WORKLOADS,
    Workload(
        name="1e6-uniform-512B",
        keys=1_000_000,
        batches=80,
        records_per_batch=100_000,
        record_size="512B",
        systems=_NO_REWRITE,
    ),
    Workload(
        name="1e6-zipf-512B",
        keys=1_000_000,
        batches=80,
        records_per_batch=100_000,
        skew="zipf",
        record_size="512B",
        systems=_NO_REWRITE,
    ),
    Workload(name="1e6-uniform", keys=1_000_000, batches=50, records_per_batch=30_000),
    Workload(name="1e6-zipf", keys=1_000_000, batches=50, records_per_batch=30_000, skew="zipf"),
    Workload(name="1e5-zipf", keys=100_000, batches=50, records_per_batch=5_000, skew="zipf"),
    Workload(name="1e5-uniform", keys=100_000, batches=50, records_per_batch=5_000),
    Workload(
        name="5e6-uniform-512B",
        keys=5_000_000,
        batches=60,
        records_per_batch=100_000,
        record_size="512B",
        systems=_NO_REWRITE,
    ),
    Workload(
        name="5e6-zipf-512B",
        keys=5_000_000,
        batches=60,
        records_per_batch=100_000,
        skew="zipf",
        record_size="512B",
        systems=_NO_REWRITE,
    ),
)
FULL = BASELINE_WORKLOADS
QUICK = (
    _baseline("1e5-uniform-512B-baselines", 100_000, 5, 10_000, "uniform"),
    _baseline("1e5-zipf-512B-baselines", 100_000, 5, 10_000, "zipf"),
)
# The pass-vs-floor run needs sink_cleaning_off on its source workload (--workloads 1e6-uniform).
CLEANER_SOURCE = {"full": "1e6-uniform", "quick": "1e6-zipf"}

REPLAYS = 2  # best of two: the first big job after a system switch pays JVM heap growth

log = logging.getLogger("bench")


def run_system(
    spark: SparkSession,
    name: str,
    files: list[str],
    root: str,
    rss: PeakRss,
    schema: pa.Schema = BATCH_SCHEMA,
) -> dict[str, Any]:
    """Feed every batch file to one system; measure ingest, size, replay and peak RSS.

    A system that cleans in the background is waited for after the last batch; that
    wait (``drain_s``) counts in ``ingest_s``, so every system's ingest is the time
    until its table is in its final state.
    """
    shutil.rmtree(root, ignore_errors=True)
    system = make_system(name, root, schema)
    meter = DirectoryMeter(root)
    rss.reset()
    per_batch, ingest_s, written = [], 0.0, 0
    for batch_id, path in enumerate(files):
        started = time.perf_counter()
        info = system.ingest(spark, batch_id, path)
        elapsed = time.perf_counter() - started
        ingest_s += elapsed
        batch_written = meter.written()
        written += batch_written
        system.analyse(info)
        size = _size(system)
        per_batch.append(
            {
                "batch": batch_id,
                "s": elapsed,
                "bytes_written": batch_written,
                "table_bytes": size.bytes,
                "files": size.files,
                **info,
            }
        )
        log.info(
            "%s batch %d: %.2f s, table %.1f MB in %d files%s",
            name,
            batch_id,
            elapsed,
            size.bytes / 1e6,
            size.files,
            " (+clean pass)" if "clean" in info else "",
        )
    finish = getattr(system, "finish", None)
    drain_s = finish() if finish else 0.0
    ingest_s += drain_s
    written += meter.written()
    peak = rss.read()
    size = _size(system)
    replays, rows, digest = [], 0, 0
    for _ in range(REPLAYS):
        started = time.perf_counter()
        rows, digest = checksum(system.state(spark))
        replays.append(time.perf_counter() - started)
    close = getattr(system, "close", None)
    if close:
        close()  # its cleaner thread would otherwise idle on beside the next systems
    log.info("%s: ingest %.1f s, replay %.2f s, %d live keys", name, ingest_s, min(replays), rows)
    latencies = [b["s"] for b in per_batch[1:]] or [b["s"] for b in per_batch]
    return {
        "ingest_s": ingest_s,
        "p50_batch_s": float(np.percentile(latencies, 50)),
        "p99_batch_s": float(np.percentile(latencies, 99)),
        "drain_s": drain_s,
        "bytes_written": written,
        "table_bytes": size.bytes,
        "files": size.files,
        "replay_s": min(replays),
        "peak_rss_mb": peak["driver"],
        "jvm_peak_rss_mb": peak["jvm"],
        "worker_peak_rss_mb": peak["workers"],
        "replay_runs_s": replays,
        "live_keys": rows,
        "state_checksum": digest,
        "per_batch": per_batch,
    }


def _size(system: Any) -> Any:
    """Live bytes and files: the system's own count, or its Delta table's."""
    size = getattr(system, "size", None)
    return size() if size else delta_table_size(system.table_uri)


def run_workload(
    spark: SparkSession,
    workload: Workload,
    work: str,
    systems: tuple[str, ...],
    rss: PeakRss,
    keep: str | None = None,
) -> dict[str, Any]:
    """Every system on one workload. Each system's directory is removed once measured
    (a per-batch MERGE leaves every table version on disk: ~16 GB at 1e6-uniform-512B),
    except ``keep``'s; the input goes at the end."""
    input_dir = os.path.join(work, "input", workload.name)
    files = generate(workload, input_dir)
    input_bytes = sum(os.path.getsize(f) for f in files)
    results = {}
    for name in systems:
        if workload.systems is not None and name not in workload.systems:
            continue
        root = os.path.join(work, workload.name, name)
        results[name] = run_system(spark, name, files, root, rss, workload.schema)
        results[name]["write_amplification"] = results[name]["bytes_written"] / input_bytes
        if name != keep:
            shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(input_dir, ignore_errors=True)
    digests = {r["state_checksum"] for r in results.values()}
    return {
        "name": workload.name,
        "keys": workload.keys,
        "batches": workload.batches,
        "records_per_batch": workload.records_per_batch,
        "skew": workload.skew,
        "tombstone_fraction": workload.tombstone_fraction,
        "record_size": workload.record_size,
        "input_bytes": input_bytes,
        "states_agree": len(digests) == 1,
        "systems": results,
    }


def warm_up(
    spark: SparkSession,
    work: str,
    systems: tuple[str, ...],
    rss: PeakRss,
    workloads: tuple[Workload, ...] = (),
) -> None:
    """Run every system the workloads run on a tiny workload first, so that no system pays
    the JVM's warm-up; in the record size of the first workload."""
    systems = tuple(
        n
        for n in systems
        if not workloads or any(w.systems is None or n in w.systems for w in workloads)
    )
    for size in (workloads[0].record_size if workloads else "35B",):  # one: the JVM is shared
        tiny = Workload(
            name=f"warm-up-{size}", keys=1_000, batches=3, records_per_batch=1_000, record_size=size
        )
        files = generate(tiny, os.path.join(work, "input", tiny.name))
        for name in systems:
            root = os.path.join(work, tiny.name, name)
            run_system(spark, name, files, root, rss, tiny.schema)
            shutil.rmtree(root, ignore_errors=True)


def _write(results: dict[str, Any], out: str, started: float) -> None:
    results["load_after"] = load_average()
    results["total_s"] = time.perf_counter() - started
    report.write(results, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small workloads (< 5 min)")
    parser.add_argument("--out", default="bench", help="where results.json and RESULTS.md go")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--systems", default=",".join(DEFAULT_SYSTEMS), help="comma-separated systems"
    )
    parser.add_argument("--workloads", default=None, help="comma-separated workload names")
    parser.add_argument("--batches", type=int, default=None, help="override every batch count")
    parser.add_argument("--no-cleaner", action="store_true", help="skip the pass-vs-floor run")
    parser.add_argument(
        "--note", action="append", default=[], help="a note for RESULTS.md (the load, the run)"
    )
    parser.add_argument(
        "--previous",
        default=None,
        help="an earlier results.json whose figures RESULTS.md keeps below the new run's",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("compacted_sink").setLevel(logging.WARNING)

    mode = "quick" if args.quick else "full"
    workloads = QUICK if args.quick else FULL
    if args.workloads:
        wanted = args.workloads.split(",")
        pool = {w.name: w for w in (QUICK if args.quick else ALL)}
        unknown = [n for n in wanted if n not in pool]
        if unknown:
            parser.error(f"unknown workload(s) {unknown}; known: {', '.join(pool)}")
        workloads = tuple(pool[n] for n in wanted)
    if args.batches:
        workloads = tuple(dataclasses.replace(w, batches=args.batches) for w in workloads)
    systems = tuple(args.systems.split(","))
    work = args.work or tempfile.mkdtemp(prefix="compacted-sink-bench-")
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    load_before = load_average()
    spark = bench_session()
    rss = PeakRss(spark)
    try:
        results: dict[str, Any] = {
            "machine": machine_description(),
            "versions": report.versions(spark),
            "mode": mode,
            "load_before": load_before,
            "workloads": [],
            "notes": list(args.note),
        }
        if args.previous:
            results["previous"] = report.keep_earlier(args.previous, args.out)
        warm_up(spark, work, systems, rss, workloads)
        for workload in workloads:
            log.info("workload %s", workload)
            measure_pass = workload.name == CLEANER_SOURCE[mode] and not args.no_cleaner
            keep = "sink_cleaning_off" if measure_pass else None
            results["workloads"].append(run_workload(spark, workload, work, systems, rss, keep))
            if measure_pass and "sink_cleaning_off" in systems:
                log.info("cleaner pass vs I/O floor on %s", workload.name)
                results["cleaner"] = cleaner_bench.run(
                    spark,
                    os.path.join(work, workload.name, "sink_cleaning_off", "log"),
                    os.path.join(work, "cleaner"),
                )
            shutil.rmtree(os.path.join(work, workload.name), ignore_errors=True)
            _write(results, args.out, started)  # a run cut short still leaves its figures
        _write(results, args.out, started)
        log.info("wrote %s in %.0f s", args.out, results["total_s"])
    finally:
        spark.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
