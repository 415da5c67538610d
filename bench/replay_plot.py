"""The recovery drill's plot: time from "the state is gone" to "the state is in memory"
against live keys, every system, from the drill's JSON files (`bench.replay --out`).

``python -m bench.replay_plot OUT.png DRILL.json [DRILL.json ...]`` (needs matplotlib, the
``plot`` extra). Each file is one drill at one size; a line a read, log-log.
"""

from __future__ import annotations

import json
import sys
from typing import Any

LINES = [
    ("dirty", "read_state_arrow_s", "read_state into Arrow, dirty section at its largest"),
    ("after_pass", "read_state_arrow_s", "read_state into Arrow, after a pass"),
    ("dirty", "state_spark_s", "state() into Spark, dirty"),
    ("after_pass", "state_spark_s", "state() into Spark, after a pass"),
    ("dirty", "arrow_scan_s", "pyarrow scan of the same files, dirty (floor)"),
    ("dirty", "spark_scan_s", "Spark scan of the same files, dirty (floor)"),
    ("redis", "redis_scan_mget_s", "Redis: SCAN + pipelined MGET"),
    ("redis", "redis_rdb_load_s", "Redis: RDB load at start"),
    ("postgres", "postgres_copy_out_s", "PostgreSQL 15: COPY out into Arrow"),
]


def points(drills: list[dict[str, Any]], section: str, key: str) -> tuple[list[int], list[float]]:
    """(live keys, seconds) of one read across the drills that measured it, by size. A drill
    too small for a dirty section (its first batch of updates would pass the trigger) has
    none to show."""
    found = sorted(
        (d["keys"], _seconds(d[section], key))
        for d in drills
        if key in d.get(section, {})
        and not (section == "dirty" and d[section].get("dirty_ratio") == 0.0)
    )
    return [k for k, _ in found], [s for _, s in found]


def _seconds(read: dict[str, Any], key: str) -> float:
    """A read's seconds; after a pass both ways of ``state()`` read the same plain scan, so
    the faster stands for both (drills before the warm-up query timed the session's first
    query in the first)."""
    if key == "state_spark_s" and read.get("dirty_ratio") == 0.0:
        return min(read[key], read.get("state_spark_pass_tasks_s", read[key]))
    return read[key]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, paths = sys.argv[1], sys.argv[2:]
    drills = [json.load(open(p)) for p in paths]
    figure, axes = plt.subplots(figsize=(9, 5.5))
    for section, key, label in LINES:
        keys, seconds = points(drills, section, key)
        if keys:
            dashed = "floor" in label or section in ("redis", "postgres")
            axes.plot(keys, seconds, "--o" if dashed else "-o", label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("live keys (512 B values)")
    axes.set_ylabel("seconds to the state in memory")
    axes.set_title("The recovery drill (bench/replay.py), 2 cores")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
