"""``compacted-sink export`` and ``replay --verify``: the disaster-recovery round trip from a shell.

A Kafka-shaped log (two partitions, offsets with gaps, headers, a tombstone, after a
pass) is built in-process. ``export --verify``, the refusals and a replay already done
start no Spark: they run in a fresh process whose ``SPARK_HOME`` points nowhere
(`no_spark_cli`). The two replays that write need Spark and run in this process on the
test session (`cli`), as does ``status``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from pyspark.sql import types as T

from sinks import CleanerConfig, CompactedStateSink

KAFKA_DDL = (
    "key string, value string, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)


def rows(entries: list[tuple[str, int, int, str | None]]) -> list[tuple]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        (k, v, "users", p, o, start + dt.timedelta(seconds=o), [("trace", f"t{o}".encode())])
        for k, p, o, v in entries
    ]


def test_export_and_replay_keep_partitions_offsets_and_config(
    spark, cli, no_spark_cli, tmp_path: Path
) -> None:
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

    export, refused, append = no_spark_cli(
        ("export", "lake/users", "--to", "export", "--verify"),
        ("replay", "export", "--to", "lake/users"),
        ("replay", "export", "--to", "lake/other", "--append"),
        cwd=tmp_path,
    )
    assert export.returncode == 0, export.stderr
    assert "exported 3 keys (4 records: 3 live, 1 tombstones" in export.stdout
    assert "log end offsets p0 8, p1 5" in export.stdout
    assert "export " in export.stdout and " matches log " in export.stdout

    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "already holds a log" in refused.stderr
    assert "--lossy-new-offsets --append" in refused.stderr
    assert append.returncode == 2 and "only goes with --lossy-new-offsets" in append.stderr

    replay = cli("replay", "export", "--to", "lake/restored", "--verify", cwd=tmp_path)
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
    (again,) = no_spark_cli(("replay", "export", "--to", "lake/restored", "--verify"), cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert "batch 0 already committed, skipped" in again.stdout
    assert "DOES NOT match" in again.stdout
    differs = next(x for x in again.stdout.splitlines() if '"partition": 1}: value differs' in x)
    assert '{"key": "c"' in differs and '"C"' in differs and '"tampered"' in differs
    assert "partition 1: log end offset 5 in export" in again.stdout

    lossy = cli(
        "replay", "export", "--to", "lake/lossy", "--lossy-new-offsets", "--verify", cwd=tmp_path
    )
    assert lossy.returncode == 0, lossy.stderr[-3000:]
    assert "restored 3 keys" in lossy.stdout and "NEW offsets in partition 0" in lossy.stdout
    assert "not compared (new-offsets mode): partition, offset" in lossy.stdout
