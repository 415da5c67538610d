"""``python -m bench.erasure_status``: what proving an erasure costs, at 1e6 (and with
``--large``, 1e7) live keys.

The log is `bench.lookup`'s (4 partitions, ~16-byte keys, 48-byte values, keys random
against offsets, cleaned to its end, then a dirty 10 % appended in 50,000-record batches).
Measured, for 1 key and for 1,000 keys (every key live): ``erasure_status`` before the
erasure (wall and this process's CPU seconds, the files listed, decoded and Delta log
files read), then ``erase`` of the same keys (the tombstone batch and the marks; no pass:
``min.cleanable.dirty.ratio`` plays no part, the next round cleans), then
``erasure_status`` again. Writes ``--out`` (default ``bench/erasure_status.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from bench.lookup import add_dirty, build_clean, key_names
from bench.measure import load_average, machine_description
from sinks import CompactedStateSink


def timed(fn) -> tuple[dict[str, float], Any]:
    wall, cpu = time.monotonic(), time.process_time()
    result = fn()
    return {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu}, result


def measure(live: int, seed: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="erasure-bench-")
    path = f"{root}/log"
    try:
        built = build_clean(path, live, seed)
        dirty = add_dirty(path, live, dict(built["ends"]), seed + 1)
        rng = np.random.default_rng(seed + 2)
        rows: dict[str, Any] = {"live_keys": live, "build": built | {"ends": None}, "dirty": dirty}
        for count in (1, 1_000):
            keys = key_names(rng.choice(live, count, replace=False)).to_pylist()
            sink = CompactedStateSink(path)
            before, status = timed(lambda k=keys, s=sink: s.erasure_status(k))
            erased, report = timed(lambda k=keys, s=sink: s.erase(k))
            after, again = timed(lambda k=keys, s=sink: s.erasure_status(k))
            rows[f"{count}_keys"] = {
                "status_before": before
                | {
                    "files_listed": status.files_listed,
                    "files_decoded": status.files_decoded,
                    "delta_log_files_read": status.delta_log_files_read,
                    "places": sum(len(k.places) for k in status.keys),
                },
                "erase": erased | {"tombstones": report.tombstones},
                "status_after": after | {"files_decoded": again.files_decoded},
            }
            print(json.dumps({live: rows[f"{count}_keys"]}), flush=True)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", action="store_true", help="also 1e7 live keys")
    parser.add_argument("--out", default="bench/erasure_status.json")
    args = parser.parse_args()
    sizes = [1_000_000, *([10_000_000] if args.large else [])]
    result = {
        "machine": machine_description(),
        "load_before": load_average(),
        "runs": [measure(live, seed=7) for live in sizes],
        "load_after": load_average(),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
