"""The log on an S3-compatible store: delta-rs commits, executors write and read through pyarrow.

The store is moto's S3 server on 127.0.0.1 (it honours ``If-None-Match``, the
conditional put delta-rs commits with). Credentials travel in storage options,
never through the environment: local Spark's Python workers were forked before
any test could set one.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from s3_server import BUCKET

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.file_reader import ParquetReaderTask, read_files
from sinks.log.filesystems import arrow_filesystem
from sinks.log.location import LogLocation
from sinks.log.log_table import LogTable, log_arrow_schema
from sinks.log.segment_writer import SegmentWriterTask, WrittenSegment
from sinks.log.store_options import delta_storage_options

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("delete_horizon_ms", LongType()),
    ]
)


def segment_rows(partition: int, first_offset: int, keys: list[str]) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "key": keys,
            "value": [f"v{first_offset + i}" for i in range(n)],
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
            "delete_horizon_ms": pa.nulls(n, pa.int64()),
        }
    )


def write_on_executor(uri: str, options: dict[str, str], rows: pa.Table) -> list[WrittenSegment]:
    """What one Spark task of `write_segments` does, called directly."""
    task = SegmentWriterTask(
        table_uri=uri,
        schema=log_arrow_schema(SCHEMA),
        stats_columns=("partition", "offset", "timestamp", "delete_horizon_ms", "key"),
        max_file_bytes=1 << 20,
        group_column=None,
        storage_options=options,
    )
    out = pa.Table.from_batches(list(task(iter(rows.to_batches()))))
    return [WrittenSegment(**r) for r in out.to_pylist()]


def test_concurrent_commits_of_one_version_conflict_on_s3(s3_options):
    uri = f"s3://{BUCKET}/conflict"
    options = delta_storage_options(uri, s3_options)
    LogTable(LogLocation(uri, options)).create(SCHEMA)
    first, second = (
        DeltaTable(uri, storage_options=options),
        DeltaTable(uri, storage_options=options),
    )
    props = CommitProperties(app_transactions=[Transaction("writer", 1)])
    schema = log_arrow_schema(SCHEMA)
    first.create_write_transaction([], "append", schema, commit_properties=props)
    with pytest.raises(CommitFailedError):
        second.create_write_transaction([], "append", schema, commit_properties=props)
    assert DeltaTable(uri, storage_options=options).version() == 1


def test_segments_written_and_read_through_pyarrow_round_trip_on_s3(s3_options):
    uri = f"s3a://{BUCKET}/users"  # Spark's spelling: the same table as s3://
    options = delta_storage_options(uri, s3_options)
    log = LogTable(LogLocation(uri, options))
    snapshot = log.create(SCHEMA)
    rows = pa.concat_tables([segment_rows(0, 0, ["a", "b", "c"]), segment_rows(1, 0, ["d", "e"])])
    written = write_on_executor(uri, options, rows)
    assert sorted((w.partition, w.base_offset, w.last_offset) for w in written) == [
        (0, 0, 2),
        (1, 0, 1),
    ]
    snapshot.commit(adds=written, data_change=True, transactions={"w": 0}, info={"t": 1})

    snapshot = LogTable(LogLocation(f"s3://{BUCKET}/users", options)).snapshot()
    assert snapshot is not None and snapshot.version == 1
    assert {s.path for s in snapshot.all_segments()} == {w.path for w in written}
    assert snapshot.segments[0][0].last_offset == 2  # statistics survived the trip
    read_back = pa.Table.from_batches(
        ParquetReaderTask(LogLocation(uri, options), log_arrow_schema(SCHEMA))(
            iter([pa.record_batch({"path": [w.path for w in written]})])
        )
    )
    assert read_back.sort_by("key").equals(rows.cast(read_back.schema).sort_by("key"))
    fs, root = arrow_filesystem(uri, options)
    assert fs.get_file_info(f"{root}/_delta_log/00000000000000000001.json").is_file


def test_spark_executors_read_s3_files_with_the_options_they_were_given(spark, s3_options):
    uri = f"s3://{BUCKET}/read"
    options = delta_storage_options(uri, s3_options)
    written = write_on_executor(uri, options, segment_rows(0, 0, ["a", "b", "c", "d"]))
    df = read_files(spark, LogLocation(uri, options), [w.path for w in written], SCHEMA)
    assert df.schema == SCHEMA
    assert sorted((r.key, r.offset) for r in df.collect()) == [
        ("a", 0),
        ("b", 1),
        ("c", 2),
        ("d", 3),
    ]


def test_sink_appends_to_s3_from_spark(spark, s3_options, clock):
    uri = f"s3://{BUCKET}/sink"
    sink = CompactedStateSink(
        uri,
        config=CleanerConfig(min_cleanable_dirty_ratio=1.0),
        storage_options=delta_storage_options(uri, s3_options),
        clock=clock,
    )
    batch = spark.createDataFrame(
        [("a", "1", 0), ("b", "2", 1), ("a", "3", 0)], "key string, value string, partition int"
    )
    sink(batch, 0)
    sink(batch, 0)  # exactly once on S3 too
    snapshot = sink.log_table.snapshot()
    assert snapshot is not None
    assert snapshot.log_end_offsets() == {0: 2, 1: 1}
    df = read_files(
        spark,
        sink.log_table.location,
        [s.path for s in snapshot.all_segments()],
        snapshot.spark_schema,
    )
    assert sorted((r.partition, r.offset, r.key, r.value) for r in df.collect()) == [
        (0, 0, "a", "1"),
        (0, 1, "a", "3"),
        (1, 0, "b", "2"),
    ]


def test_sink_appends_cleans_and_reads_state_on_s3_with_pyarrow_reads(spark, s3_options, clock):
    uri = f"s3://{BUCKET}/compacted"
    sink = CompactedStateSink(
        uri,
        config=CleanerConfig(min_cleanable_dirty_ratio=0.01, delete_retention_ms=1_000),
        storage_options=delta_storage_options(uri, s3_options),
        clock=clock,
    )
    schema = "key string, value string, partition int"
    sink(spark.createDataFrame([("a", "1", 0), ("b", "1", 1), ("c", "1", 0)], schema), 0)
    clock.advance(10)
    sink(spark.createDataFrame([("a", "2", 0), ("b", None, 1), ("c", "2", 0)], schema), 1)
    clock.advance(2_000)
    sink.clean(force=True)
    assert sorted(tuple(r) for r in sink.state().collect()) == [("a", "2"), ("c", "2")]
    assert sorted((r.partition, r.offset, r.key) for r in sink.log().collect()) == [
        (0, 2, "a"),
        (0, 3, "c"),
    ]
    checkpoint = DeltaTable(sink.checkpoint_path, storage_options=sink.storage_options)
    assert sink.checkpoint_path == f"s3://{BUCKET}/_cleaner-offset-checkpoint"
    assert checkpoint.version() >= 1
