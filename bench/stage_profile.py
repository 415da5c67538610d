"""Wall time per stage of the sink's hook, by wrapping the functions it calls (no core edits).

``python -m bench.stage_profile [--keys N --records R --batches B --compact]`` feeds
one workload to the sink and prints, per stage, total and per-batch seconds.
Stages nest (``clean`` contains its own ``LogTable.snapshot`` calls); each line
is the time spent inside that function, wherever it was called from.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import sinks.cleaner
import sinks.log_table
import sinks.sink
from bench.session import bench_session
from bench.systems import make_system
from bench.workload import Workload, generate
from checkpoints import CleanerOffsetCheckpoint

TOTALS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.perf_counter() - started
            CALLS[name] += 1

    return wrapper


def instrument() -> None:
    """Wrap the hook's stages where the sink module looks them up."""
    for name in (
        "prepare_batch",
        "inspect_batch",
        "assign_offsets",
        "write_segments",
        "check_schema",
    ):
        setattr(sinks.sink, name, _timed(name, getattr(sinks.sink, name)))
    sinks.cleaner.write_segments = _timed("clean.write_segments", sinks.cleaner.write_segments)
    cls = sinks.sink.CompactedStateSink
    for method in (
        "__call__",
        "clean",
        "logs_to_clean",
        "dirty_ratio",
        "_commit_append",
        "_finish",
        "_refreshed",
    ):
        setattr(cls, method, _timed(f"sink.{method}", getattr(cls, method)))
    sinks.log_table.LogTable.snapshot = _timed(
        "LogTable.snapshot", sinks.log_table.LogTable.snapshot
    )
    seg = sinks.log_table.LogSnapshot.__dict__["segments"]
    seg.func = _timed("LogSnapshot.segments", seg.func)
    sinks.log_table.LogSnapshot.commit = _timed(
        "LogSnapshot.commit", sinks.log_table.LogSnapshot.commit
    )
    for method in ("read", "write"):
        setattr(
            CleanerOffsetCheckpoint,
            method,
            _timed(f"checkpoint.{method}", getattr(CleanerOffsetCheckpoint, method)),
        )
    cleaner = sinks.cleaner.Cleaner
    cleaner.clean = _timed("Cleaner.clean", cleaner.clean)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--skew", default="uniform")
    parser.add_argument("--compact", action="store_true")
    args = parser.parse_args()
    instrument()
    spark = bench_session()
    work = tempfile.mkdtemp(prefix="stage-profile-")
    try:
        workload = Workload(
            name="p",
            keys=args.keys,
            batches=args.batches,
            records_per_batch=args.records,
            skew=args.skew,
        )
        files = generate(workload, os.path.join(work, "input"))
        system = make_system(
            "compacted_sink" if args.compact else "append_only", os.path.join(work, "sys")
        )
        system.ingest(spark, 0, files[0])  # warm-up, not counted
        TOTALS.clear()
        CALLS.clear()
        started = time.perf_counter()
        for batch_id, path in enumerate(files[1:], start=1):
            system.ingest(spark, batch_id, path)
        total = time.perf_counter() - started
        n = len(files) - 1
        print(f"{n} batches, {total:.1f} s, {total / n:.2f} s/batch")
        for name, seconds in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
            print(f"{name:28s} {seconds:8.2f} s {seconds / n:6.2f} s/batch {CALLS[name]:5d} calls")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
