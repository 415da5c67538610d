"""Kafka input is appended without a shuffle: each input partition's rows stay in their task.

Spark's Kafka source reads each topic-partition's offset range as one input partition.
The append sorts each where it is and writes it (`SparkPrepared.run` without an
exchange). Only when two tasks held overlapping offsets of one partition, which the Kafka
source never produces, is the batch written again through the shuffle, so that one task
sees each partition and the repeats are found as before.
"""

from __future__ import annotations

import os

import pytest

from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import BadInputError

KAFKA = "key string, value string, partition int, offset long"


def open_sink(lake, clock):
    """Cleaning off (a dirty ratio never passes 1.0): the files are the append's own."""
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0)
    return CompactedStateSink(str(lake / "log"), config=config, clock=clock)


def kafka_frame(spark, *input_partitions):
    """One Spark input partition per argument (each a list of (partition, offset) of equal
    length), as Spark's Kafka source hands a batch over."""
    rows = [(f"k{p}-{o}", f"v{p}-{o}", p, o) for part in input_partitions for p, o in part]
    rdd = spark.sparkContext.parallelize(rows, len(input_partitions))
    assert rdd.glom().map(len).collect() == [len(part) for part in input_partitions]
    return spark.createDataFrame(rdd, KAFKA)


def ranges(sink, partition):
    segments = sink.log_table.snapshot().segments[partition]
    return [(s.base_offset, s.last_offset) for s in segments]


def parquet_files(path):
    return sorted(f for _, _, files in os.walk(path) for f in files if f.endswith(".parquet"))


def test_each_input_partition_is_written_where_it_was_read(spark, lake, clock):
    sink = open_sink(lake, clock)
    p0_low = [(0, o) for o in reversed(range(5))]  # sorted in its task, not shuffled
    p0_high = [(0, o) for o in range(5, 10)]
    p1 = [(1, o) for o in range(5)]
    sink(kafka_frame(spark, p0_low, p0_high, p1), 0)
    assert ranges(sink, 0) == [(0, 4), (5, 9)]  # one file per task that held partition 0
    assert ranges(sink, 1) == [(0, 4)]
    offsets = sorted((r.partition, r.offset) for r in sink.log().collect())
    assert offsets == sorted([*p0_low, *p0_high, *p1])
    assert sink.state().count() == 15


def test_interleaved_offsets_of_one_partition_are_written_again_through_the_shuffle(
    spark, lake, clock
):
    sink = open_sink(lake, clock)
    evens, odds = [(0, o) for o in range(0, 10, 2)], [(0, o) for o in range(1, 10, 2)]
    sink(kafka_frame(spark, evens, odds), 0)
    assert ranges(sink, 0) == [(0, 9)]  # one task saw the partition
    assert len(parquet_files(lake / "log")) == 1  # the overlapping files were deleted
    assert sorted(r.offset for r in sink.log().collect()) == list(range(10))


def test_an_offset_repeated_across_tasks_fails_the_batch_and_leaves_nothing(spark, lake, clock):
    sink = open_sink(lake, clock)
    first, second = [(0, o) for o in range(5)], [(0, o) for o in range(4, 9)]
    with pytest.raises(BadInputError, match="partition 0 has 1 rows whose 'offset' repeats"):
        sink(kafka_frame(spark, first, second), 0)
    assert parquet_files(lake) == []  # no log, no file of either attempt
