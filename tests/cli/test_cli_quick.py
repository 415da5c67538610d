"""The CLI's small questions answered without Spark, and its failures in one line.

A log is built in-process; then each command runs as a subprocess whose
``SPARK_HOME`` points nowhere, so a command that tried to start Spark would fail:
``status``, ``export --verify``, ``clean --once`` with nothing cleanable (saying
why), a refused ``replay`` into a log holding records, and time travel outside
the log (one line, the traceback only under ``--verbose``). A ``run`` whose input
holds a null key (Spark started, as it must be) fails with one line too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from sinks import CleanerConfig, CompactedStateSink, read_state
from streaming.inputs.kafka import write_kafka_files

CLI = [sys.executable, "-m", "streaming.cli"]
ROOT = Path(__file__).resolve().parents[2]


def no_spark_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_HOME": str(cwd / "no-spark-here")}
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_status_export_clean_and_failures_without_spark(spark, tmp_path):
    path = tmp_path / "lake" / "users"
    # The wall clock, as the CLI's: the tombstone's delete horizon is a day ahead.
    sink = CompactedStateSink(str(path), config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(2000)] + [("k1", None, 1)]
    sink(spark.createDataFrame(rows, "key string, value string, partition int"), 0)
    sink.clean(force=True)
    sink(spark.createDataFrame([("k2", "w2", 0)], "key string, value string, partition int"), 1)
    keys = read_state(str(path)).num_rows

    status = no_spark_cli("status", "lake/users", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    (log,) = json.loads(status.stdout)["logs"]
    assert log["cleaner_budget"] == "unlimited"

    export = no_spark_cli("export", "lake/users", "--to", "export", "--verify", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert f"exported {keys} keys" in export.stdout
    assert " matches log " in export.stdout and "0 missing, 0 unexpected" in export.stdout

    clean = no_spark_cli("clean", "lake/users", "--once", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    line = next(x for x in clean.stdout.splitlines() if "nothing to clean" in x)
    # The log's own threshold (1.0, stored when the sink created it), not the default 0.5.
    assert "p0: dirty ratio 0." in line and "not above min.cleanable.dirty.ratio 1" in line
    assert re.search(r"p1: no dirty records, next tombstone due in 2[34]\.\d h", line)

    replay = no_spark_cli("replay", "export", "--to", "lake/users", cwd=tmp_path)
    assert replay.returncode == 2
    assert replay.stderr.count("\n") == 1 and "pass --lossy-new-offsets --append" in replay.stderr
    assert replay.stderr.startswith("compacted-sink replay: configuration error: --to ")

    travel = no_spark_cli("export", "lake/users", "--to", "old", "--as-of", "999", cwd=tmp_path)
    assert travel.returncode == 1
    assert travel.stderr.startswith("compacted-sink export: TimeTravelError: ")
    assert "time travel reaches versions 0 to" in travel.stderr
    assert travel.stderr.count("\n") == 1 and "Traceback" not in travel.stderr
    verbose = no_spark_cli(
        "--verbose", "export", "lake/users", "--to", "old", "--as-of", "999", cwd=tmp_path
    )
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


JOB = """
[source]
format = "files"
path = "input"

[sink]
path = "lake/users"

[trigger]
available_now = true
"""


def test_run_with_a_null_key_fails_in_one_line(tmp_path):
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {
            "key": None if i == 3 else f"k{i}".encode(),
            "value": b"v",
            "topic": "users",
            "partition": 0,
            "offset": i,
            "timestamp": start,
            "timestampType": 0,
        }
        for i in range(10)
    ]
    write_kafka_files(tmp_path / "input", [rows])
    (tmp_path / "job.toml").write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_MASTER": "local[1]"}
    done = subprocess.run(
        [*CLI, "run", "job.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "compacted-sink run: BadInputError: batch 0: 1 of 10 rows have a null key"
    )
    assert done.stderr.count("BadInputError") == 1
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 20
