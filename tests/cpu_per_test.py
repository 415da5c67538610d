"""The CPU each test costs, for finding where a run's time goes on a machine whose cores are
busy (there wall time says little: a test waiting on a subprocess lends its core to the next).

With ``COMPACTED_SINK_TEST_CPU=<dir>`` set, each pytest process (each xdist worker) appends one
JSON line per test to ``<dir>/<worker>.jsonl``: ``{"test", "cpu", "wall"}``, where ``cpu`` is
the CPU-seconds of the process's whole tree from the test's setup to its teardown (pytest, its
Spark JVM, the JVM's Python workers, the processes the test starts; Linux ``/proc``), and
``jobs``, the Spark jobs the process's own SparkContext ran meanwhile (none without one). The
controller of an xdist run writes nothing: its tree holds every worker. A process of the tree
that ends unwaited by its parent takes its CPU out of the tree (Spark's Python daemon stopped
with workers still running, say): the test in whose window it ends shows less, even below zero.
Then::

    python tests/cpu_per_test.py <dir>

prints the total, the files and the tests by CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ENV = "COMPACTED_SINK_TEST_CPU"


class CpuPerTest:
    """The pytest plugin `tests/conftest.py` registers when `ENV` names a directory."""

    def __init__(self, directory: Path) -> None:
        # The benchmarks' meter; imported here, since `report` runs as a script from tests/
        # where the repository's root (and bench) is not on the path.
        from bench.measure import process_tree_cpu_s

        self.process_tree_cpu_s = process_tree_cpu_s
        directory.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out = directory / f"{worker}.jsonl"
        self.started: dict[str, tuple[float, float, int]] = {}

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.started[nodeid] = (self.process_tree_cpu_s(), time.monotonic(), spark_jobs())

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        cpu, wall, jobs_before = self.started.pop(nodeid)
        jobs = spark_jobs()
        line = {
            "test": nodeid,
            "cpu": round(self.process_tree_cpu_s() - cpu, 2),
            "wall": round(time.monotonic() - wall, 2),
            "jobs": jobs - jobs_before if jobs >= jobs_before else jobs,  # else a new context
        }
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def spark_jobs() -> int:
    """The jobs this process's SparkContext has run since it started; 0 without one."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return 0
    return context._jsc.sc().dagScheduler().numTotalJobs()


def report(directory: Path, top: int = 30) -> str:
    rows = [json.loads(line) for f in directory.glob("*.jsonl") for line in f.open()]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        file = files[row["test"].split("::")[0]]
        file[0] += row["cpu"]
        file[1] += row["wall"]
        file[2] += row.get("jobs", 0)
    total = f"{sum(r['cpu'] for r in rows):.0f} CPU-s, {sum(r.get('jobs', 0) for r in rows)} jobs"
    lines = [f"{len(rows)} tests, {total}", "CPU-s  wall-s  jobs  file"]
    for name, (cpu, wall, jobs) in sorted(files.items(), key=lambda f: -f[1][0])[:top]:
        lines.append(f"{cpu:6.1f} {wall:7.1f} {jobs:5d}  {name}")
    lines.append("CPU-s  wall-s  jobs  test")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        lines.append(f"{row['cpu']:6.1f} {row['wall']:7.1f} {row.get('jobs', 0):5d}  {row['test']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
