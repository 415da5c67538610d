"""``writeStream.format("compacted-state")``: executors stage, the driver commits exactly once."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

from sinks import CompactedStateSink
from sinks.errors import ConfigError
from sinks.log.location import LogLocation
from sinks.produce.dead_letter import DeadLetterTable
from streaming.consumers.datasource import SinkOptions, register, remove_stale_staged, staged_files
from streaming.inputs.kafka import KAFKA_SCHEMA, kafka_shaped_files, write_kafka_files
from streaming.status.progress import ProgressListener, spark_progress


def write_files(directory: Path, files: int, rows: int) -> dict[bytes, bytes | None]:
    batches = []
    latest: dict[bytes, bytes | None] = {}
    next_offset = [0, 0]
    n = 0
    for _ in range(files):
        batch = []
        for _ in range(rows):
            key = f"k{n % 7}".encode()
            partition = n % 7 % 2  # a key stays in one partition
            value = None if n % 5 == 4 else f"v{n}".encode()
            batch.append(
                {
                    "key": key,
                    "value": value,
                    "topic": "t",
                    "partition": partition,
                    "offset": next_offset[partition],
                    "timestamp": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
                    "timestampType": 0,
                }
            )
            latest[key] = value
            next_offset[partition] += 1
            n += 1
        batches.append(batch)
    write_kafka_files(directory, batches)
    return latest


def test_options_are_checked_when_the_query_starts() -> None:
    with pytest.raises(ConfigError, match="'path'"):
        SinkOptions.parse({})
    with pytest.raises(ConfigError, match="min.cleanable.dirty.ratio"):
        SinkOptions.parse({"path": "/tmp/x", "min.cleanable.dirty.ratio": "high"})


@pytest.mark.both_sessions
def test_a_query_writes_the_log_through_the_data_source(spark, lake) -> None:
    register(spark)
    latest = write_files(lake / "input", files=2, rows=20)
    path = str(lake / "users")

    def run() -> None:
        stream = kafka_shaped_files(spark, str(lake / "input"), max_files_per_trigger=1)
        query = (
            stream.drop("topic")
            .writeStream.format("compacted-state")
            .option("path", path)
            .option("key_columns", "key")
            .option("min.cleanable.dirty.ratio", "0.5")
            .option("checkpointLocation", str(lake / "_chk"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)

    lines: list[str] = []
    listener = ProgressListener(out=lines.append)
    spark.streams.addListener(listener)
    try:
        run()
        deadline = time.monotonic() + 30  # listener events arrive asynchronously
        while not any("terminated" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    assert any(" batch 0: 20 input rows" in line for line in lines), lines
    assert any(" batch 1: 20 input rows" in line for line in lines), lines

    sink = CompactedStateSink(path, key_columns=("key",))
    log = sink.log()
    assert log.count() == 40
    by_partition = {
        p: sorted(r["offset"] for r in log.collect() if r["partition"] == p) for p in (0, 1)
    }
    assert by_partition[0] == list(range(len(by_partition[0])))  # Kafka offsets kept
    assert by_partition[1] == list(range(len(by_partition[1])))
    state = {bytes(r["key"]): bytes(r["value"]) for r in sink.state().collect()}
    assert state == {k: v for k, v in latest.items() if v is not None}
    assert staged_files(path) == []
    assert set(log.columns) >= {"timestampType", "delete_horizon_ms"}
    assert log.schema["key"].dataType == KAFKA_SCHEMA["key"].dataType

    stats = sink.clean(force=True)  # the data source appends; cleaning runs beside it
    assert stats is not None and stats.records_read == 40
    run()  # the same checkpoint: nothing new, nothing twice
    assert sink.log().count() == len(latest)  # one record per key after the pass


def test_bad_rows_go_to_dead_letters_through_the_data_source(spark, lake) -> None:
    """The data source appends through the same produce path: dead letters included."""
    register(spark)
    rows = [
        {"key": k, "value": b"v", "partition": 0, "offset": i}
        for i, k in enumerate([b"a", None, b"b", b"c"])
    ]
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    extra = {"topic": "t", "timestamp": when, "timestampType": 0}
    write_kafka_files(lake / "input", [[{**r, **extra} for r in rows]])
    path, dead = str(lake / "users"), str(lake / "dead")
    query = (
        kafka_shaped_files(spark, str(lake / "input"), max_files_per_trigger=1)
        .drop("topic")
        .writeStream.format("compacted-state")
        .option("path", path)
        .option("dead_letter_table", dead)
        .option("checkpointLocation", str(lake / "_chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None
    sink = CompactedStateSink(path, key_columns=("key",))
    assert sorted(bytes(r["key"]) for r in sink.state().collect()) == [b"a", b"b", b"c"]
    letters = DeadLetterTable(LogLocation(dead)).read()
    assert letters.column("reason").to_pylist() == ["null key (key)"]
    assert json.loads(letters.column("record")[0].as_py())["offset"] == 1


@pytest.mark.both_sessions
def test_long_work_reports_progress_lines(spark) -> None:
    lines: list[str] = []
    with spark_progress(spark, "export", out=lines.append, every_s=0.2):
        spark.range(0, 200_000, numPartitions=4).selectExpr("sum(id)").collect()
    assert lines[-1].startswith("export: done in ")


def test_a_starting_query_removes_staged_files_a_killed_one_left(tmp_path) -> None:
    staging = tmp_path / "log" / "_staging"
    staging.mkdir(parents=True)
    old, new = f"{'a' * 32}.parquet", f"{'b' * 32}.parquet"
    (staging / old).write_bytes(b"x")
    (staging / new).write_bytes(b"y")
    (staging / "theirs.parquet").write_bytes(b"z")  # not named as the sink stages: not ours
    hours_ago = time.time() - 7200
    for name in (old, "theirs.parquet"):
        os.utime(staging / name, (hours_ago, hours_ago))
    assert remove_stale_staged(str(tmp_path / "log"), older_than_ms=3_600_000) == 1
    assert sorted(staged_files(str(tmp_path / "log"))) == sorted(
        [str(staging / new), str(staging / "theirs.parquet")]
    )
