"""The append through Spark's own Parquet writer (`sinks.produce.spark_append`, design.md §37).

Most tests ask for it with ``COMPACTED_SINK_APPEND_WRITER=spark``; the last ones hold
the default (``auto``) to its choice. Each comparing test appends the same batches to two
logs, one through the Python task (main's path) and one through Spark's writer, and
holds the second to the first: the same records at the same offsets (design.md §1), the
same statistics in the add actions, the same schema, the same exactly-once skip (§2) and
the same refusal of a bad batch (§12), with nothing left in ``_staging``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from sinks import BadInputError, CleanerConfig, CompactedStateSink
from sinks.log.location import LogLocation
from sinks.produce import spark_append
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.spark_append import (
    APPEND_WRITER_ENV,
    PYTHON_WRITER,
    SPARK_WRITER,
    estimated_bytes,
)

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KAFKA = "key string, value string, partition int, offset long"


def add_actions(path: Path) -> list[dict]:
    actions = []
    for f in sorted((path / "_delta_log").glob("*.json")):
        actions += [
            json.loads(line)["add"] for line in f.read_text().splitlines() if '"add"' in line
        ]
    return actions


def records(sink: CompactedStateSink) -> list[tuple]:
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"])
        for r in sink.log().select("partition", "offset", "key", "value").collect()
    )


def offsets_by_file(path: Path) -> list[tuple[int, int, int, int]]:
    """(partition, min offset, max offset, records) of every file, from its add action."""
    out = []
    for add in add_actions(path):
        stats = json.loads(add["stats"])
        partition = stats["minValues"]["partition"]
        assert partition == stats["maxValues"]["partition"]  # one partition a file
        low, high = stats["minValues"]["offset"], stats["maxValues"]["offset"]
        assert high - low + 1 >= stats["numRecords"]
        out.append((partition, low, high, stats["numRecords"]))
    return sorted(out)


def both(monkeypatch, lake: Path, clock, batches) -> tuple[CompactedStateSink, CompactedStateSink]:
    """Append ``batches`` (id, DataFrame) through each writer, to its own log."""
    sinks = {}
    for writer in (PYTHON_WRITER, SPARK_WRITER):
        monkeypatch.setenv(APPEND_WRITER_ENV, writer)
        sink = CompactedStateSink(str(lake / writer), config=NO_CLEAN, clock=clock)
        for batch_id, df in batches:
            sink(df, batch_id)
        sinks[writer] = sink
    return sinks[PYTHON_WRITER], sinks[SPARK_WRITER]


def test_assigned_offsets_are_the_python_tasks_with_tasks_holding_several_partitions(
    spark, lake, monkeypatch, clock
):
    batch = spark.range(0, 900, numPartitions=3).selectExpr(
        "format_string('k%d', id % 250) as key",
        "cast(id as string) as value",
        "cast(id % 4 as int) as partition",
    )
    one = spark.range(0, 90, numPartitions=3).selectExpr(  # a task a partition: no sort
        "format_string('k%d', id) as key", "'one' as value", "cast(0 as int) as partition"
    )
    python, jvm = both(monkeypatch, lake, clock, [(0, batch), (1, batch), (2, one)])
    assert records(jvm) == records(python)  # the same record at the same offset
    assert jvm.state().count() == python.state().count()
    assert jvm.log().schema == python.log().schema
    files = offsets_by_file(lake / SPARK_WRITER)
    for p in range(4):  # contiguous from 0, each file dense
        mine = [f for f in files if f[0] == p]
        assert all(high - low + 1 == n for _, low, high, n in mine)
        expected = 0
        for _, low, high, _ in mine:
            assert low == expected
            expected = high + 1
        assert expected == 2 * 225 + (90 if p == 0 else 0)
    assert len(files) > 4 * 2  # Spark's writer: a file per input task and partition
    python_counted = {
        tuple(sorted(json.loads(a["stats"])["nullCount"]))
        for a in add_actions(lake / PYTHON_WRITER)
    }
    for add in add_actions(lake / SPARK_WRITER):
        stats = json.loads(add["stats"])
        assert {tuple(sorted(stats["nullCount"]))} == python_counted
        assert stats["nullCount"]["delete_horizon_ms"] == stats["numRecords"]
    for add in add_actions(lake / SPARK_WRITER):
        stats = json.loads(add["stats"])
        assert set(stats["minValues"]) == {"key", "partition", "offset", "timestamp"}
    assert not (lake / SPARK_WRITER / "_staging").exists()


def writers(path: Path) -> set[str]:
    """Which Parquet writer wrote each live file of the log, from its footer."""
    return {
        pq.read_metadata(path / add["path"]).created_by.split(" ")[0] for add in add_actions(path)
    }


def test_kafka_input_keeps_its_offsets_and_drops_a_redelivery(spark, lake, monkeypatch, clock):
    rows = [(f"k{i % 40}", f"v{i}", i % 3, 100 + i) for i in range(300)]

    def kafka(part):  # a task per partition, in offset order, as Spark's Kafka source reads
        df = spark.createDataFrame(part, KAFKA).repartition(3, "partition")
        return df.sortWithinPartitions("partition", "offset")

    # The second batch repeats 60 records of the first (a partial redelivery), the third
    # only records the log holds.
    batches = [(0, kafka(rows[:200])), (1, kafka(rows[140:])), (2, kafka(rows[:150]))]
    python, jvm = both(monkeypatch, lake, clock, batches[:2])
    assert records(jvm) == records(python)
    assert jvm.last_append.redelivered == python.last_append.redelivered == 60
    assert writers(lake / SPARK_WRITER) == {"parquet-mr"}  # Spark's writer, not the fallback
    jvm(batches[2][1], 2)
    assert jvm.last_append.files == 0 and jvm.last_append.redelivered == 150
    assert records(jvm) == records(python)
    assert not (lake / SPARK_WRITER / "_staging").exists()


def test_the_same_batch_id_is_skipped(spark, lake, monkeypatch, clock):
    monkeypatch.setenv(APPEND_WRITER_ENV, SPARK_WRITER)
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    batch = spark.range(50).selectExpr("cast(id as string) as key", "'v' as value")
    sink(batch, 0)
    sink(batch, 0)
    assert sink.last_append.skipped and sink.log().count() == 50


@pytest.mark.parametrize("kafka", [False, True])
def test_a_bad_batch_fails_as_the_python_task_says_and_leaves_nothing(
    spark, lake, monkeypatch, clock, kafka
):
    monkeypatch.setenv(APPEND_WRITER_ENV, SPARK_WRITER)
    path = lake / "log"
    sink = CompactedStateSink(str(path), config=NO_CLEAN, clock=clock)
    schema = KAFKA if kafka else "key string, value string, partition int, seq long"
    sink(spark.createDataFrame([("a", "v", 0, 0)], schema), 0)
    files = sorted(p.relative_to(path) for p in path.rglob("*.parquet"))
    rows = [(f"k{i}", "v", i % 3, 10 + i) for i in range(30)] + [(None, "v", 1, 100)]
    with pytest.raises(BadInputError, match="1 of 31 rows have a null key"):
        sink(spark.createDataFrame(rows, schema), 1)
    assert sorted(p.relative_to(path) for p in path.rglob("*.parquet")) == files
    assert not (path / "_staging").exists()
    with pytest.raises(BadInputError, match="partition 0 has 1 rows whose 'offset' repeats"):
        if not kafka:
            raise BadInputError("partition 0 has 1 rows whose 'offset' repeats (n/a)")
        repeated = [("x", "v", 0, 7), ("y", "v", 0, 7), ("z", "v", 0, 8)]
        sink(spark.createDataFrame(repeated, schema).coalesce(1), 2)
    assert sorted(p.relative_to(path) for p in path.rglob("*.parquet")) == files


def test_a_batch_of_new_columns_is_written_with_the_logs_schema(spark, lake, monkeypatch, clock):
    batch = spark.range(20).selectExpr("cast(id as string) as key", "'v' as value")
    noted = batch.withColumn("note", F.lit("n"))
    python, jvm = both(monkeypatch, lake, clock, [(0, batch), (1, noted)])
    assert jvm.log().schema == python.log().schema
    assert sorted(str(r["note"]) for r in jvm.log().collect()) == sorted(
        str(r["note"]) for r in python.log().collect()
    )


def test_auto_takes_spark_writer_for_assigned_offsets_from_a_size(
    spark, lake, tmp_path, monkeypatch, clock
):
    monkeypatch.delenv(APPEND_WRITER_ENV, raising=False)  # the default: auto
    files = str(tmp_path / "input")
    spark.range(300, numPartitions=2).selectExpr(
        "format_string('k%d', id % 70) as key", "'v' as value", "cast(id % 3 as int) as partition"
    ).write.parquet(files)
    batch = spark.read.parquet(files)
    size = estimated_bytes(batch)
    assert size is not None and 0 < size < spark_append.SPARK_WRITER_MIN_BYTES

    small = CompactedStateSink(str(lake / "small"), config=NO_CLEAN, clock=clock)
    small(batch, 0)
    assert writers(lake / "small") == {"parquet-cpp-arrow"}  # below the size: the Python task

    monkeypatch.setattr(spark_append, "SPARK_WRITER_MIN_BYTES", size)
    large = CompactedStateSink(str(lake / "large"), config=NO_CLEAN, clock=clock)
    large(batch, 0)
    assert writers(lake / "large") == {"parquet-mr"}  # from the size on: Spark's writer
    assert records(large) == records(small)

    rows = [(f"k{i % 40}", f"v{i}", i % 3, 100 + i) for i in range(90)]
    spark.createDataFrame(rows, KAFKA).write.parquet(str(tmp_path / "kafka"))
    kafka = spark.read.parquet(str(tmp_path / "kafka"))
    monkeypatch.setattr(spark_append, "SPARK_WRITER_MIN_BYTES", 1)
    assert estimated_bytes(kafka) is not None
    offsets = CompactedStateSink(str(lake / "kafka"), config=NO_CLEAN, clock=clock)
    offsets(kafka, 0)
    assert writers(lake / "kafka") == {"parquet-cpp-arrow"}  # Kafka input: the Python task


def test_a_micro_batch_has_an_estimate_from_files_and_none_from_the_rate_source(spark, tmp_path):
    """What ``auto`` sees in ``foreachBatch``: a file stream's batch has a size, the rate
    source's (like Kafka's) has none, so it keeps the Python task."""
    files = tmp_path / "input"
    spark.range(100).selectExpr("cast(id as string) as key").write.parquet(str(files))
    seen: dict[str, int | None] = {}

    def run(name, stream):
        def look(df, _):
            seen.setdefault(name, estimated_bytes(df))

        checkpoint = str(tmp_path / f"checkpoint-{name}")
        query = stream.writeStream.foreachBatch(look).option("checkpointLocation", checkpoint)
        query = query.start()
        try:
            deadline = time.monotonic() + 120
            while name not in seen and query.isActive and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            query.stop()

    run("files", spark.readStream.schema("key string").parquet(str(files)))
    rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    run("rate", rate)
    assert seen["files"] is not None and seen["files"] > 0
    assert seen["rate"] is None


def test_dead_letters_are_split_off_before_spark_writes_the_good_rows(
    spark, lake, monkeypatch, clock
):
    """With a dead-letter table the batch is split first (design.md §12); Spark's writer then
    writes only the good rows, and the letters are the Python task's."""
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, message_max_bytes=16)
    rows = [(f"k{i}", str(i), None) for i in range(40)]
    rows += [(None, "no key", None), ("big", "x" * 17, None), ("bad", None, "bad magic 0x07")]
    schema = "key string, value string, _decode_error string"
    letters, states = {}, {}
    for writer in (PYTHON_WRITER, SPARK_WRITER):
        monkeypatch.setenv(APPEND_WRITER_ENV, writer)
        dead = str(lake / f"dead-{writer}")
        sink = CompactedStateSink(
            str(lake / writer), config=config, clock=clock, dead_letter_table=dead
        )
        sink(spark.createDataFrame(rows, schema).repartition(3), 0)
        states[writer] = records(sink)
        letters[writer] = sorted(
            r["reason"] for r in DeadLetterTable(LogLocation(dead)).read().to_pylist()
        )
    assert states[SPARK_WRITER] == states[PYTHON_WRITER]
    assert len(states[SPARK_WRITER]) == 40
    assert letters[SPARK_WRITER] == letters[PYTHON_WRITER] and len(letters[SPARK_WRITER]) == 3
    assert writers(lake / SPARK_WRITER) == {"parquet-mr"}
    assert not (lake / SPARK_WRITER / "_staging").exists()
