"""``python -m bench.erasure_query``: what an erasure costs a running streaming query.

The log is `bench.lookup`'s (4 partitions, ~16-byte keys, 48-byte values, ``--live`` keys,
default 1e6, cleaned to its end). A Structured Streaming query appends to it through the
sink (``foreachBatch``, ``cleaning="auto"``: inside a query the log's passes run on the
sink's background worker, beside the batches): the ``rate-micro-batch`` source,
``--rows-per-batch`` updates of random live keys a batch, a ``--trigger-s`` processing-time
trigger,
``min.cleanable.dirty.ratio`` 0.99 so that no pass but the erasure's runs. After
``--before`` batches, ``compacted-sink erase LOG --keys-file F`` erases 1,000 random live
keys in a process of its own (an operator's command: no Spark there, so the query's cleaner
makes the erasure's pass at its next round); the query runs on until ``--after`` batches
have started after that pass ended.

Measured, per batch, the sink call's wall time (``foreachBatch`` entry to return) and the
trigger's (``durationMs.triggerExecution``), grouped into batches that ended before the
erase command started, batches overlapping the command or the erasure's pass, and batches
that started after the pass; the command's wall time and the pass's figures. Writes
``--out`` (default ``bench/erasure_query.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from bench.lookup import build_clean, key_names
from bench.measure import load_average, machine_description
from bench.session import bench_session
from sinks import CompactedStateSink
from sinks.log.log_config import alter_log_config
from sinks.log.log_table import LogTable

ERASED_KEYS = 1_000


def progress(text: str) -> None:
    print(f"[erasure-query {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


class TimedSink:
    """The sink as ``foreachBatch``'s function, recording each call's start and end (ms)."""

    def __init__(self, sink: CompactedStateSink) -> None:
        self.sink = sink
        self.calls: list[dict[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        started = now_ms()
        self.sink(batch_df, batch_id)
        with self.lock:
            self.calls.append({"batch_id": batch_id, "start_ms": started, "end_ms": now_ms()})

    def count(self) -> int:
        with self.lock:
            return len(self.calls)


def summary(durations: list[float]) -> dict[str, Any]:
    if not durations:
        return {"batches": 0}
    return {
        "batches": len(durations),
        "median_s": round(statistics.median(durations), 3),
        "max_s": round(max(durations), 3),
        "mean_s": round(statistics.fmean(durations), 3),
    }


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="erasure-query-bench-")
    path = f"{root}/log"
    try:
        built = build_clean(path, args.live, seed=7)
        # The topic's config lives on the log (design.md §29): no pass but the erasure's.
        alter_log_config(LogTable(path), add={"min.cleanable.dirty.ratio": "0.99"})
        spark = bench_session()
        sink = CompactedStateSink(path)
        passes: list[dict[str, Any]] = []
        sink.add_pass_listener(
            lambda s: passes.append(
                {
                    "start_ms": s.start_ms,
                    "duration_ms": s.duration_ms,
                    "partitions": list(s.partitions),
                    "records_read": s.records_read,
                    "records_written": s.records_written,
                }
            )
        )
        timed = TimedSink(sink)
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.rows_per_batch)
            .load()
            .selectExpr(f"pmod(xxhash64(value, timestamp), {args.live}) as kid", "value")
            .selectExpr(
                "concat('user-', lpad(cast(kid as string), 10, '0')) as key",
                "concat(lpad(cast(value as string), 47, '.'), 'q') as value",
                "cast(pmod(kid, 4) as int) as partition",
            )
        )
        query = (
            source.writeStream.foreachBatch(timed)
            .option("checkpointLocation", f"{root}/checkpoint")
            .trigger(processingTime=f"{args.trigger_s} seconds")
            .start()
        )
        try:
            wait_for(lambda: timed.count() >= args.before + 1, 600, "the batches before")
            keys = key_names(np.random.default_rng(11).choice(args.live, ERASED_KEYS, False))
            keys_file = f"{root}/keys.txt"
            with open(keys_file, "w") as f:
                f.write("\n".join(keys.to_pylist()) + "\n")
            progress(f"{timed.count()} batches in; erasing {ERASED_KEYS} keys")
            erase_start = now_ms()
            erased = subprocess.run(
                [sys.executable, "-m", "streaming.cli", "erase", path, "--keys-file", keys_file],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
            )
            erase_end = now_ms()
            progress(f"erased in {(erase_end - erase_start) / 1000:.1f} s; waiting for its pass")
            wait_for(lambda: passes, 900, "the erasure's pass")
            progress(f"pass: {passes[0]}")
            pass_end = passes[0]["start_ms"] + passes[0]["duration_ms"]
            wait_for(
                lambda: sum(1 for c in list(timed.calls) if c["start_ms"] > pass_end) >= args.after,
                900,
                "the batches after",
            )
            recent = list(query.recentProgress)
        finally:
            progress("stopping the query")
            query.stop()
            progress("stopped")
        triggers = {p["batchId"]: p["durationMs"].get("triggerExecution", 0) / 1000 for p in recent}
        calls = [c for c in timed.calls if c["batch_id"] > 0]  # batch 0 opens the log
        phases: dict[str, list[dict[str, int]]] = {"before": [], "during": [], "after": []}
        for c in calls:
            if c["end_ms"] < erase_start:
                phases["before"].append(c)
            elif c["start_ms"] > pass_end:
                phases["after"].append(c)
            else:
                phases["during"].append(c)
        result: dict[str, Any] = {
            "live_keys": args.live,
            "erased_keys": ERASED_KEYS,
            "rows_per_batch": args.rows_per_batch,
            "trigger_s": args.trigger_s,
            "build_s": built.get("seconds"),
            "erase_command_s": (erase_end - erase_start) / 1000,
            "erase_output": erased.stdout.strip().splitlines()[:1],
            "erasure_pass": passes[0]
            | {"starts_after_erase_end_s": (passes[0]["start_ms"] - erase_end) / 1000},
            "passes": len(passes),
        }
        for name, chosen in phases.items():
            result[name] = {
                "sink_call": summary([(c["end_ms"] - c["start_ms"]) / 1000 for c in chosen]),
                "trigger": summary(
                    [triggers[c["batch_id"]] for c in chosen if c["batch_id"] in triggers]
                ),
                "batches": [
                    {
                        "batch_id": c["batch_id"],
                        "sink_call_s": (c["end_ms"] - c["start_ms"]) / 1000,
                        "trigger_s": triggers.get(c["batch_id"]),
                        "starts_after_erase_s": (c["start_ms"] - erase_start) / 1000,
                    }
                    for c in chosen
                ],
            }
            print(json.dumps({name: result[name]["sink_call"]}), flush=True)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--live", type=int, default=1_000_000, help="live keys in the log")
    parser.add_argument("--rows-per-batch", type=int, default=20_000)
    parser.add_argument("--trigger-s", type=int, default=2)
    parser.add_argument("--before", type=int, default=8, help="batches before the erasure")
    parser.add_argument("--after", type=int, default=8, help="batches after its pass")
    parser.add_argument("--out", default="bench/erasure_query.json")
    args = parser.parse_args()
    result = {
        "machine": machine_description(),
        "load_before": load_average(),
        "run": measure(args),
        "load_after": load_average(),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
