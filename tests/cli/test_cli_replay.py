"""``compacted-sink export`` and ``replay --verify``: the disaster-recovery round trip from a shell.

A Kafka-shaped log (two partitions, offsets with gaps, headers, a tombstone, after a
pass) is built in-process; the commands run as subprocesses. ``export --verify``, the
refusals and a replay already done start no Spark (``SPARK_HOME`` points nowhere);
the two replays that write do.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink

CLI = [sys.executable, "-m", "streaming.cli"]
ROOT = Path(__file__).resolve().parents[2]
KAFKA_DDL = (
    "key string, value string, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)


def cli(*args: str, cwd: Path, spark: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_MASTER": "local[2]"}
    if not spark:
        env["SPARK_HOME"] = str(cwd / "no-spark-here")
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def rows(entries: list[tuple[str, int, int, str | None]]) -> list[tuple]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        (k, v, "users", p, o, start + dt.timedelta(seconds=o), [("trace", f"t{o}".encode())])
        for k, p, o, v in entries
    ]


def test_export_and_replay_keep_partitions_offsets_and_config(spark, tmp_path: Path) -> None:
    schema = T._parse_datatype_string(KAFKA_DDL)
    sink = CompactedStateSink(
        str(tmp_path / "lake" / "users"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0)
    )
    first = [("a", 0, 0, "A"), ("b", 0, 2, "B"), ("c", 1, 1, "C"), ("a", 0, 5, "A2")]
    sink(spark.createDataFrame(rows(first), schema), 0)
    sink.clean(force=True)
    sink(spark.createDataFrame(rows([("b", 0, 7, None), ("d", 1, 4, "D")]), schema), 1)
    ends = sink.log_table.snapshot().log_end_offsets()
    assert ends == {0: 8, 1: 5}

    export = cli("export", "lake/users", "--to", "export", "--verify", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert "exported 3 keys (4 records: 3 live, 1 tombstones" in export.stdout
    assert "log end offsets p0 8, p1 5" in export.stdout
    assert "export " in export.stdout and " matches log " in export.stdout

    refused = cli("replay", "export", "--to", "lake/users", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "already holds a log" in refused.stderr
    assert "--lossy-new-offsets --append" in refused.stderr
    append = cli("replay", "export", "--to", "lake/other", "--append", cwd=tmp_path)
    assert append.returncode == 2 and "only goes with --lossy-new-offsets" in append.stderr

    replay = cli("replay", "export", "--to", "lake/restored", "--verify", cwd=tmp_path, spark=True)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "restored 4 records from export" in replay.stdout
    assert "at their partitions and offsets (log end offsets p0 8, p1 5" in replay.stdout
    assert " matches export " in replay.stdout, replay.stdout
    status = cli("status", "lake/restored", "--json", cwd=tmp_path)
    (log,) = json.loads(status.stdout)["logs"]
    assert [p["log_end_offset"] for p in log["partitions"]] == [8, 5]

    # Someone wrote to the restored log: a replay already done verifies again and says what.
    restored = CompactedStateSink(str(tmp_path / "lake" / "restored"))
    restored(spark.createDataFrame(rows([("c", 1, 9, "tampered")]), schema), 7)
    again = cli("replay", "export", "--to", "lake/restored", "--verify", cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert "batch 0 already committed, skipped" in again.stdout
    assert "DOES NOT match" in again.stdout
    differs = next(x for x in again.stdout.splitlines() if '"partition": 1}: value differs' in x)
    assert '{"key": "c"' in differs and '"C"' in differs and '"tampered"' in differs
    assert "partition 1: log end offset 5 in export" in again.stdout

    lossy = cli(
        "replay", "export", "--to", "lake/lossy", "--lossy-new-offsets", "--verify",
        cwd=tmp_path, spark=True,
    )  # fmt: skip
    assert lossy.returncode == 0, lossy.stderr[-3000:]
    assert "restored 3 keys" in lossy.stdout and "NEW offsets in partition 0" in lossy.stdout
    assert "not compared (new-offsets mode): partition, offset" in lossy.stdout
