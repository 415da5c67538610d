"""The append in one Spark job: checks, numbering and writing in one task pass (design.md §12).

A bad batch is found after its files were written; the files are deleted and
nothing is committed, so design.md §12 (never half-written) still holds. Kafka input
is not shuffled; a bad Kafka batch is checked again through the shuffle (a second job).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sinks import BadInputError, CleanerConfig, CompactedStateSink
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable
from sinks.produce.append_batch import ArrowRecords
from sinks.produce.log_append import LogAppender
from sinks.produce.log_validator import OffsetAssigner, PartitionCounts
from sinks.produce.validity import RecordValidator

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KAFKA = "key string, value string, partition int, offset long"
_groups = itertools.count()


@contextmanager
def spark_jobs(spark):
    """The ids of the Spark jobs run in the block, with AQE off (else a shuffle is a job too)."""
    sc = spark.sparkContext
    group = f"append-jobs-{next(_groups)}"
    was = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    sc.setJobGroup(group, "counting an append's jobs")
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        jobs.extend(sc.statusTracker().getJobIdsForGroup(group))
        sc.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.adaptive.enabled", was)


def stages(spark, job: int) -> int:
    return len(list(spark.sparkContext.statusTracker().getJobInfo(job).stageIds))


def data_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*.parquet")}


def committed_files(sink: CompactedStateSink) -> set[str]:
    snapshot = sink.log_table.snapshot()
    return {s.path for s in snapshot.all_segments()} if snapshot else set()


def test_an_append_is_one_spark_job_with_one_shuffle(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    batch = spark.range(300).selectExpr(
        "cast(id as string) as key", "'v' as value", "cast(id % 3 as int) as partition"
    )
    sink(batch, 0)
    with spark_jobs(spark) as jobs:
        sink(batch, 1)
    assert len(jobs) == 1 and stages(spark, jobs[0]) == 2  # shuffle by partition, then the task
    assert sink.last_append.records == 300 and sink.last_append.partitions == (0, 1, 2)
    kafka = spark.range(300).selectExpr(
        "cast(id as string) as key",
        "'v' as value",
        "cast(id % 3 as int) as partition",
        "id + 1000 as offset",
    )
    with spark_jobs(spark) as jobs:
        sink(kafka, 2)
    assert len(jobs) == 1 and stages(spark, jobs[0]) == 1  # Kafka input: no shuffle at all
    rows = sink.log().filter("offset >= 1000").count()
    assert rows == 300


def test_bad_kafka_offsets_are_counted_whole_through_the_shuffle_and_no_file_is_left(
    spark, lake, clock
):
    """Kafka input is written where it was read; a task that finds a bad row sends the batch
    through the shuffle (a second job), where each partition's rows meet in one task."""
    path = lake / "log"
    sink = CompactedStateSink(str(path), config=NO_CLEAN, clock=clock)
    sink(spark.createDataFrame([("a", "1", 0, 0), ("b", "1", 1, 0)], KAFKA), 0)
    version = sink.log_table.snapshot().version
    # the good partitions' files are written, then deleted with the batch
    good = [(f"k{i}", "v", p, 10 + i) for p in (1, 2, 3) for i in range(20)]
    bad = [("x", "1", 0, 5), ("y", "1", 0, 5), ("z", "1", 0, 6), ("w", "1", 0, 6)]
    bad += [("n", "1", 4, None), ("m", "1", 4, None), ("o", "1", 4, 9)]
    with spark_jobs(spark) as jobs, pytest.raises(BadInputError) as error:
        sink(spark.createDataFrame(good + bad, KAFKA), 1)
    assert [stages(spark, job) for job in sorted(jobs)] == [1, 2]
    message = str(error.value)
    assert "partition 0 has 2 rows whose 'offset' repeats another row's" in message
    assert "2 rows of partition 4 have a null 'offset'" in message
    assert message.endswith("nothing was written")
    assert sink.log_table.snapshot().version == version
    assert data_files(path) == committed_files(sink)


@pytest.mark.parametrize("kafka", [False, True])
def test_a_bad_first_batch_leaves_nothing(spark, lake, clock, kafka):
    path = lake / "log"
    sink = CompactedStateSink(str(path), config=NO_CLEAN, clock=clock)
    rows = [(f"k{i}", "v", i % 6, i) for i in range(60)] + [(None, "v", 3, 100)]
    schema = KAFKA if kafka else "key string, value string, partition int, seq long"
    with pytest.raises(BadInputError, match="1 of 61 rows have a null key"):
        sink(spark.createDataFrame(rows, schema), 0)
    assert not path.exists()


def test_records_below_the_log_end_are_dropped_and_an_all_old_batch_commits_nothing(
    spark, lake, clock, delta_commits
):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(spark.createDataFrame([("a", "1", 0, 0), ("b", "1", 0, 1)], KAFKA), 0)
    sink(spark.createDataFrame([("a", "1", 0, 0), ("b", "1", 0, 1)], KAFKA), 1)  # redelivered
    assert sink.last_append.files == 0 and not sink.last_append.skipped
    assert [a for a in delta_commits(path)[-1] if "add" in a] == []
    assert sink.log().count() == 2


# -- the Arrow side, without Spark ------------------------------------------------------------


def kafka_batch(rows: list[tuple[str | None, int | None, int | None]]) -> pa.RecordBatch:
    keys, partitions, offsets = zip(*rows, strict=True)
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array(["v"] * len(rows), pa.string()),
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
        }
    )


def test_validator_finds_repeats_across_batches_and_counts_per_partition():
    keys = LogKeys(key_columns=("key",))
    validator = RecordValidator(keys=keys, has_offsets=True, message_max_bytes=100)
    assert validator.validate(kafka_batch([("a", 0, 1), ("b", 0, 2)]))
    assert not validator.validate(kafka_batch([("c", 0, 2), ("d", 0, 3), ("e", 1, 3)]))
    assert not validator.validate(kafka_batch([(None, 1, None), ("f", None, 4), ("g", -1, 5)]))
    report = validator.report()
    assert report.partitions[0] == PartitionCounts(rows=4, repeated_offsets=1)
    assert report.partitions[1] == PartitionCounts(rows=2, null_keys=1, null_offsets=1)
    assert report.rows == 8 and report.null_partitions == 1 and report.negative_partitions == 1
    problems = report.problems(keys=keys, message_max_bytes=100)
    assert problems == [
        "1 of 8 rows have a null key ('key'); a compacted log cannot hold a record without a key",
        "1 of 8 rows have a null 'partition'",
        "1 of 8 rows have a negative 'partition'",
        "partition 0 has 1 rows whose 'offset' repeats another row's",
        "1 rows of partition 1 have a null 'offset'",
    ]


def test_offsets_are_assigned_per_partition_from_the_log_end_across_batches():
    assigner = OffsetAssigner({0: 10})
    first = assigner.assign(kafka_batch([("a", 0, None), ("b", 1, None), ("c", 0, None)]))
    second = assigner.assign(kafka_batch([("d", 1, None), ("e", 0, None)]))
    assert first.column("offset").to_pylist() == [10, 0, 11]
    assert second.column("offset").to_pylist() == [1, 12]


def test_the_arrow_append_applies_the_same_checks_and_a_bad_first_batch_leaves_nothing(lake):
    path = lake / "log"
    appender = LogAppender(LogTable(str(path)), keys=LogKeys(key_columns=("key",)), config=NO_CLEAN)
    schema = T.StructType(
        [
            T.StructField("key", T.StringType()),
            T.StructField("value", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField("delete_horizon_ms", T.LongType()),
        ]
    )
    rows = pa.table(
        {
            "key": pa.array(["a", "b", "c", "d"], pa.string()),
            "value": pa.array(["1", "2", "3", "4"], pa.string()),
            "partition": pa.array([1, 0, 0, 1], pa.int32()),
            "offset": pa.array([7, 3, 3, 8], pa.int64()),
            "timestamp": pa.array([0] * 4, pa.timestamp("us", tz="UTC")),
            "delete_horizon_ms": pa.nulls(4, pa.int64()),
        }
    )
    with pytest.raises(BadInputError, match="partition 0 has 1 rows whose 'offset' repeats"):
        appender.append(ArrowRecords(rows, schema), app_id="t", batch_id=0)
    assert not path.exists()
    good = rows.set_column(3, "offset", pa.array([7, 3, 4, 8], pa.int64()))
    info = appender.append(ArrowRecords(good, schema), app_id="t", batch_id=0)
    assert sorted((w.partition, w.base_offset, w.last_offset) for w in info.written) == [
        (0, 3, 4),
        (1, 7, 8),
    ]
    again = appender.append(ArrowRecords(good, schema), app_id="t", batch_id=0)
    assert again.already_committed and not again.written  # the append skips it by itself
