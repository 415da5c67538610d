"""Where a cleaning pass spends its time, and a prototype of a cheaper pass (no core edits).

``python -m bench.pass_variants --log PATH`` (a log never cleaned) times, on the
same input files:

- ``read``: scan every column (noop sink): the read floor;
- ``floor``: read, plain filter keeping the pass's fraction, Spark Parquet write;
- ``dedupe``: `retain_latest` (max_by over a struct of every column), noop sink;
- ``dedupe+layout``: and the pass's repartition + sortWithinPartitions, noop sink;
- ``pass``: the sink's own pass (`CompactedStateSink.clean(force=True)` on a copy);
- ``narrow``: the prototype: find the latest offset per key from (partition, key,
  offset) only, broadcast-semi-join the offsets back onto the scan, apply the
  tombstone rules row by row, write with the sink's writer (`write_segments`) and
  commit nothing. The wide rows are never shuffled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.cleaner_bench import io_floor
from bench.narrow_pass import narrow_retained, write_uncommitted
from bench.session import bench_session
from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner import retain_latest
from sinks.records import OFFSET, PARTITION


def _noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(
    spark: SparkSession, log_path: str, work: str, repeats: int = 1, only: list[str] | None = None
) -> dict[str, float]:
    sink = CompactedStateSink(log_path, key_columns=("key",), config=CleanerConfig())
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    now = int(time.time() * 1000)
    keys = ["key"]
    wide = dict(
        key_columns=keys, sequence_column=None, pass_start_ms=now, delete_retention_ms=86_400_000
    )

    def scan() -> DataFrame:
        return sink.log_table.read(spark, snapshot)

    def layout(df: DataFrame) -> DataFrame:
        return df.repartition(1, PARTITION).sortWithinPartitions(PARTITION, OFFSET)

    def narrow_write() -> None:
        out = os.path.join(work, "narrow")
        shutil.rmtree(out, ignore_errors=True)
        kept = narrow_retained(
            scan(), key_columns=keys, pass_start_ms=now, delete_retention_ms=86_400_000
        )
        write_uncommitted(kept.repartition(1, PARTITION), out, snapshot, keys)

    def narrow_coalesced() -> None:
        out = os.path.join(work, "narrow1")
        shutil.rmtree(out, ignore_errors=True)
        kept = narrow_retained(
            scan(), key_columns=keys, pass_start_ms=now, delete_retention_ms=86_400_000
        )
        write_uncommitted(kept.coalesce(1), out, snapshot, keys)

    def wide_write() -> None:
        out = os.path.join(work, "wide")
        shutil.rmtree(out, ignore_errors=True)
        write_uncommitted(
            layout(scan().transform(lambda d: retain_latest(d, **wide))), out, snapshot, keys
        )

    def real_pass() -> None:
        copy = os.path.join(work, "copy", "log")
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
        shutil.copytree(log_path, copy)
        started = time.perf_counter()
        CompactedStateSink(copy, key_columns=("key",)).clean(force=True)
        timings.setdefault("pass", []).append(time.perf_counter() - started)

    retained = scan().transform(lambda d: retain_latest(d, **wide)).count()
    keep = retained / sum(s.num_records for s in snapshot.all_segments())
    paths = [os.path.join(log_path, s.path) for s in snapshot.all_segments()]
    variants: dict[str, Callable[[], Any]] = {
        "read": lambda: _noop(scan()),
        "floor": lambda: io_floor(spark, paths, keep, os.path.join(work, "floor")),
        "dedupe": lambda: _noop(scan().transform(lambda d: retain_latest(d, **wide))),
        "dedupe+layout": lambda: _noop(
            layout(scan().transform(lambda d: retain_latest(d, **wide)))
        ),
        "dedupe+layout+write (pass without commit)": wide_write,
        "narrow: latest offsets + broadcast semi-join": lambda: _noop(
            narrow_retained(
                scan(), key_columns=keys, pass_start_ms=now, delete_retention_ms=86_400_000
            )
        ),
        "narrow + write (prototype pass without commit)": narrow_write,
        "narrow + coalesce(1) + write (one output group, no second shuffle)": narrow_coalesced,
    }
    if only:
        variants = {k: v for k, v in variants.items() if any(o in k for o in only)}
    timings: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, fn in variants.items():
            timings.setdefault(name, []).append(_timed(fn))
        if not only or any(o in "pass" for o in only):
            real_pass()
    return {name: min(runs) for name, runs in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True, help="a never-cleaned log (e.g. append_only)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated substrings of variant names")
    args = parser.parse_args()
    spark = bench_session()
    work = tempfile.mkdtemp(prefix="pass-variants-")
    try:
        only = [o for o in args.only.split(",") if o]
        for name, seconds in run(spark, args.log, work, args.repeats, only).items():
            print(f"{name:50s} {seconds:7.2f} s")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
