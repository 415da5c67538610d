"""``python -m bench.combine_append [--rounds N] [--out FILE]``: the sink with and without
``combine.before.append`` on Zipf keys (design.md §44).

2e5 keys, 10 batches of 50,000 records of 512 B (`bench.workload`, Zipf), fed to the sink
as its foreachBatch hook with passes off (dirty ratio 1.0), then one forced pass. Rounds
alternate off and on, so a drift of a loaded machine spreads over both. Per run: ingest
seconds, bytes written by the appends, rows stored, the forced pass's seconds and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

from bench.measure import DirectoryMeter, load_average
from bench.session import bench_session
from bench.workload import Workload, generate
from sinks import CleanerConfig, CompactedStateSink

WORKLOAD = Workload(
    name="2e5-zipf-512B",
    keys=200_000,
    batches=10,
    records_per_batch=50_000,
    skew="zipf",
    record_size="512B",
)


def run_once(spark: Any, files: list[str], root: str, combine: bool) -> dict[str, Any]:
    path = os.path.join(root, "on" if combine else "off")
    sink = CompactedStateSink(
        path,
        key_columns=("key",),
        config=CleanerConfig(min_cleanable_dirty_ratio=1.0, combine_before_append=combine),
        sink_id="bench-combine",
        cleaning="inline",
    )
    os.makedirs(path, exist_ok=True)
    meter = DirectoryMeter(path)
    started = time.monotonic()
    for batch_id, file in enumerate(files):
        sink(spark.read.parquet(file), batch_id)
    ingest_s = time.monotonic() - started
    appended_bytes = meter.written()
    snapshot = sink.log_table.snapshot()
    rows_stored = sum(s.num_records for s in snapshot.all_segments())
    started = time.monotonic()
    sink.clean(force=True)
    pass_s = time.monotonic() - started
    pass_bytes = meter.written()
    live = sink.state().count()
    sink.close()
    shutil.rmtree(path)
    return {
        "combine": combine,
        "ingest_s": round(ingest_s, 2),
        "appended_bytes": appended_bytes,
        "rows_stored": rows_stored,
        "forced_pass_s": round(pass_s, 2),
        "forced_pass_bytes": pass_bytes,
        "live_keys": live,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="bench/combine_append.json")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="combine-bench-")
    try:
        files = generate(WORKLOAD, os.path.join(work, "input"))
        spark = bench_session()
        runs = []
        for round_number in range(args.rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for combine in order:
                result = run_once(spark, files, work, combine)
                result["round"] = round_number
                result["load_average"] = load_average()
                print(json.dumps(result), flush=True)
                runs.append(result)
        with open(args.out, "w") as out:
            json.dump(
                {"workload": WORKLOAD.name, "loaded_machine": True, "runs": runs}, out, indent=1
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
