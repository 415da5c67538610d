"""Exit codes of processes that used the sink, run many times (``make soak-exit``).

Runs ``tests/sinks/exit_script.py``: streaming-query processes (with and without
``close()``), Spark-free processes that leave a state-reading worker inside delta-rs
at exit, and the same Spark-free processes with the worker *not* registered with
`sinks.shutdown` (the control, which shows the abort); a service's reads (`read_state`,
`lookup`, ``status``, consumer offsets), the checkpoint tables read right before the exit,
and their control, delta-rs's ``to_pyarrow_table`` (design.md §58); and a user's script with
Spark (appends, ``state()``, `read_state`, `lookup`, ``close()``). Prints exit codes per case.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "sinks" / "exit_script.py"


def run(*args: str, control: bool = False) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "EXIT_SCRIPT_UNREGISTERED": "1" if control else "0",
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, timeout=600
    )
    return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100, help="Spark-free runs per case")
    parser.add_argument("--spark-runs", type=int, default=10, help="streaming-query runs")
    parser.add_argument("--user-runs", type=int, default=10, help="user-script runs (Spark)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases: dict[str, collections.Counter[int]] = {}
        spark = collections.Counter()
        for i in range(args.spark_runs):
            spark[run("spark", f"{tmp}/spark{i}/log", "close" if i % 2 else "no-close")] += 1
        cases["streaming query (half with close())"] = spark
        log = f"{tmp}/spark0/log"
        for name, control in (("Spark-free, worker registered", False), ("control", True)):
            cases[name] = collections.Counter(
                run("arrow", log, control=control) for _ in range(args.runs)
            )
        for name, mode in (
            ("service reads (no Spark)", "reader"),
            ("checkpoint tables read, then exit", "checkpoints"),
            ("control: delta-rs to_pyarrow_table, then exit", "to-pyarrow-table"),
        ):
            cases[name] = collections.Counter(run(mode, log) for _ in range(args.runs))
        cases["user script (appends, state(), read_state, lookup, close())"] = collections.Counter(
            run("user", f"{tmp}/user{i}/log") for i in range(args.user_runs)
        )
    for name, codes in cases.items():
        print(f"{name}: " + ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items())))


if __name__ == "__main__":
    main()
