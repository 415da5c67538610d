"""The CLI's small questions answered without Spark, and its failures in one line.

A log is built in-process; then the commands run one after the other in one fresh
process whose ``SPARK_HOME`` points nowhere (`no_spark_cli`), so a command that tried to
start Spark would fail: ``status``, ``lookup``, ``configs --describe``, ``export
--verify``, ``clean --once`` with nothing cleanable (saying why), a refused ``replay``
into a log holding records, and time travel outside the log (one line, the traceback only
under ``--verbose``). A ``run`` whose input holds a null key (Spark started, as it must
be: the test session, in this process) fails with one line too, and py4j logs no
traceback; what a terminal shows of a failed ``run``, JVM included, is
``tests/cli/test_first_hour.py``'s.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re

from sinks import CleanerConfig, CompactedStateSink, read_state
from streaming.inputs.kafka import write_kafka_files


def test_status_export_clean_and_failures_without_spark(spark, no_spark_cli, tmp_path):
    path = tmp_path / "lake" / "users"
    # The wall clock, as the CLI's: the tombstone's delete horizon is a day ahead.
    sink = CompactedStateSink(str(path), config=CleanerConfig(min_cleanable_dirty_ratio=1.0))
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(2000)] + [("k1", None, 1)]
    sink(spark.createDataFrame(rows, "key string, value string, partition int"), 0)
    sink.clean(force=True)
    sink(spark.createDataFrame([("k2", "w2", 0)], "key string, value string, partition int"), 1)
    keys = read_state(str(path)).num_rows

    status, lookup, configs, export, clean, replay, travel, verbose = no_spark_cli(
        ("status", "lake/users", "--json"),
        ("lookup", "lake/users", "k2", "k1"),
        ("configs", "--path", "lake/users", "--describe"),
        ("export", "lake/users", "--to", "export", "--verify"),
        ("clean", "lake/users", "--once"),
        ("replay", "export", "--to", "lake/users"),
        ("export", "lake/users", "--to", "old", "--as-of", "999"),
        ("--verbose", "export", "lake/users", "--to", "old", "--as-of", "999"),
        cwd=tmp_path,
    )
    assert status.returncode == 0, status.stderr
    (log,) = json.loads(status.stdout)["logs"]
    assert log["cleaner_budget"] == "unlimited"

    assert lookup.returncode == 0, lookup.stderr
    assert [line.split()[:2] for line in lookup.stdout.splitlines()] == [
        ["k2", "w2"],
        ["k1", "(no"],
    ]
    assert configs.returncode == 0, configs.stderr
    assert "min.cleanable.dirty.ratio" in configs.stdout

    assert export.returncode == 0, export.stderr
    assert f"exported {keys} keys" in export.stdout
    assert " matches log " in export.stdout and "0 missing, 0 unexpected" in export.stdout

    assert clean.returncode == 0, clean.stderr
    line = next(x for x in clean.stdout.splitlines() if "nothing to clean" in x)
    # The log's own threshold (1.0, stored when the sink created it), not the default 0.5.
    assert "p0: dirty ratio 0." in line and "not above min.cleanable.dirty.ratio 1" in line
    assert re.search(r"p1: no dirty records, next tombstone due in 2[34]\.\d h", line)

    assert replay.returncode == 2
    assert replay.stderr.count("\n") == 1 and "pass --lossy-new-offsets --append" in replay.stderr
    assert replay.stderr.startswith("compacted-sink replay: configuration error: --to ")

    assert travel.returncode == 1
    assert travel.stderr.startswith("compacted-sink export: TimeTravelError: ")
    assert "time travel reaches versions 0 to" in travel.stderr
    assert travel.stderr.count("\n") == 1 and "Traceback" not in travel.stderr
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


def test_run_with_a_null_key_fails_in_one_line(spark, cli, caplog, tmp_path):
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
    done = cli("run", "job.toml", cwd=tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "compacted-sink run: BadInputError: batch 0: 1 of 10 rows have a null key"
    )
    assert done.stderr.count("BadInputError") == 1
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 20
    # py4j logs the foreachBatch function's traceback at ERROR unless `run` quiets it.
    py4j = [r for r in caplog.records if r.name.startswith("py4j")]
    assert [r for r in py4j if r.levelno >= logging.ERROR] == []
