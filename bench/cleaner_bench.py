"""One cleaning pass against the I/O floor: Spark reading the same files and writing the kept rows.

The pass runs on a copy of a log that was never cleaned (every byte dirty),
with ``clean(force=True)``. The floor reads the same input files and writes
the same number of rows with a plain filter (a hash of the offset keeping the
pass's retained fraction), zstd Parquet through Spark's own writer: no
shuffle, no dedupe. The sink is opened (recovered) before the pass is timed, as a
running sink is. Efficiency is floor time / pass time (1.0 = the pass costs
no more than moving its bytes). Each is timed ``repeats`` times; the best counts.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.measure import DirectoryMeter
from sinks import CleanerConfig, CompactedStateSink

_HASH_BUCKETS = 1 << 20


def io_floor(spark: SparkSession, paths: list[str], keep: float, out: str) -> float:
    """Seconds Spark takes to read ``paths`` and write a ``keep`` fraction of their rows."""
    shutil.rmtree(out, ignore_errors=True)
    threshold = int(keep * _HASH_BUCKETS)
    started = time.perf_counter()
    (
        spark.read.parquet(*paths)
        .filter(F.xxhash64("offset").bitwiseAND(_HASH_BUCKETS - 1) < threshold)
        .write.parquet(out)
    )
    return time.perf_counter() - started


def one_pass(source_log: str, copy: str) -> tuple[float, dict[str, Any], list[str]]:
    """Copy ``source_log`` and clean the copy once; returns seconds, figures, input files."""
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    shutil.copytree(source_log, copy)
    sink = CompactedStateSink(copy, key_columns=("key",), config=CleanerConfig())
    sink.recover()  # what opening the log costs, once per sink object: not the pass's
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    inputs = [os.path.join(copy, s.path) for s in snapshot.all_segments()]
    meter = DirectoryMeter(os.path.dirname(copy))
    started = time.perf_counter()
    stats = sink.clean(force=True)
    elapsed = time.perf_counter() - started
    assert stats is not None, "the copied log had nothing to clean"
    figures = {
        "segments_read": stats.segments_read,
        "segments_written": stats.segments_written,
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_read": stats.records_read,
        "records_written": stats.records_written,
        "pass_reported_s": stats.duration_ms / 1000,
        "bytes_on_disk_written": meter.written(),
    }
    return elapsed, figures, inputs


def run(spark: SparkSession, source_log: str, work: str, *, repeats: int = 3) -> dict[str, Any]:
    """The ``cleaner`` section of results.json.

    Passes and floors alternate (pass, floor, pass, floor, ...) so that a machine
    whose load changes during the run weighs on both alike; the best of each counts.
    """
    passes, floors = [], []
    figures: dict[str, Any] = {}
    for i in range(repeats):
        elapsed, figures, inputs = one_pass(source_log, os.path.join(work, f"pass-{i}", "log"))
        passes.append(elapsed)
        keep = figures["records_written"] / figures["records_read"]
        floors.append(io_floor(spark, inputs, keep, os.path.join(work, f"floor-{i}")))
    pass_s, floor_s = min(passes), min(floors)
    return {
        "pass_s": pass_s,
        "floor_s": floor_s,
        "efficiency": floor_s / pass_s,
        "source": os.path.basename(os.path.dirname(os.path.dirname(source_log))),
        "pass_runs_s": passes,
        "floor_runs_s": floors,
        "kept_fraction": figures["records_written"] / figures["records_read"],
        **figures,
    }
