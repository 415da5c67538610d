"""The foreachBatch hook: offsets (design.md §1), exactly once (§2), input shapes and bad input."""

from __future__ import annotations

import datetime as dt

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from sinks import BadInputError, CleanerConfig, CompactedStateSink, SchemaMismatchError
from sinks.log.log_format import LOG_END_OFFSET_TXN

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)


def offsets(sink, partition=0):
    rows = sink.log().filter(F.col("partition") == partition).select("key", "offset").collect()
    return sorted((r["offset"], r["key"]) for r in rows)


@pytest.mark.both_sessions
def test_offsets_assigned_contiguously_per_partition_in_input_order(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    batch = spark.createDataFrame(
        [("a", "1", 0), ("b", "1", 1), ("c", "1", 0), ("d", "1", 1), ("e", "1", 0)],
        "key string, value string, partition int",
    ).coalesce(1)
    sink(batch, 0)
    sink(batch, 1)
    assert offsets(sink, 0) == [(0, "a"), (1, "c"), (2, "e"), (3, "a"), (4, "c"), (5, "e")]
    assert offsets(sink, 1) == [(0, "b"), (1, "d"), (2, "b"), (3, "d")]
    assert sink.last_append.records == 5 and sink.last_append.partitions == (0, 1)


def test_offsets_continue_after_restart(spark, lake, clock):
    path = str(lake / "log")
    batch = spark.createDataFrame([("a", "1"), ("b", "2")], "key string, value string")
    CompactedStateSink(path, config=NO_CLEAN, clock=clock)(batch, 0)
    restarted = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    restarted(batch, 1)
    assert [o for o, _ in offsets(restarted)] == [0, 1, 2, 3]


@pytest.mark.both_sessions
def test_same_batch_id_twice_writes_once_also_from_a_new_sink(spark, lake, clock, delta_commits):
    path = str(lake / "log")
    batch = spark.createDataFrame([("a", "1"), ("b", "2")], "key string, value string")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(batch, 7)
    versions = len(delta_commits(path))
    sink(batch, 7)
    assert sink.last_append.skipped
    restarted = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    restarted(batch, 7)
    restarted(batch, 3)  # an older batch id is also already committed
    assert restarted.last_append.skipped
    assert len(delta_commits(path)) == versions
    assert restarted.log().count() == 2
    append = delta_commits(path)[-1]
    assert [a["add"]["dataChange"] for a in append if "add" in a] == [True]
    txns = {a["txn"]["appId"]: a["txn"]["version"] for a in append if "txn" in a}
    assert txns[sink.sink_id] == 7 and txns[LOG_END_OFFSET_TXN.format(0)] == 2


def test_two_sink_ids_both_write_the_same_batch_id(spark, lake, clock):
    path = str(lake / "log")
    batch = spark.createDataFrame([("a", "1")], "key string, value string")
    CompactedStateSink(path, config=NO_CLEAN, clock=clock, sink_id="query-1")(batch, 0)
    second = CompactedStateSink(path, config=NO_CLEAN, clock=clock, sink_id="query-2")
    second(batch, 0)
    assert not second.last_append.skipped
    assert [o for o, _ in offsets(second)] == [0, 1]


@pytest.mark.both_sessions
def test_kafka_shaped_input_is_accepted_as_it_comes_with_offsets_kept(spark, lake, clock):
    """Spark's Kafka source columns, offsets with gaps (testCleaningBeyondMissingOffsets)."""
    ts = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = [
        (b"k1", b"v1", "users", 0, 3, ts, 0, [("h", b"x")]),
        (b"k2", b"v2", "users", 0, 9, ts, 0, []),
        (b"k1", b"v3", "users", 0, 17, ts, 0, None),
        (b"k3", None, "users", 1, 100, ts, 0, None),
    ]
    schema = (
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
    )
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(spark.createDataFrame(rows, schema), 0)
    log = sink.log()
    assert set(log.columns) >= {"key", "value", "topic", "offset", "timestampType", "headers"}
    assert offsets(sink, 0) == [(3, b"k1"), (9, b"k2"), (17, b"k1")]
    assert offsets(sink, 1) == [(100, b"k3")]
    # a redelivered Kafka batch (offsets below the log end) adds nothing
    more = [
        (b"k2", b"v4", "users", 0, 17, ts, 0, None),
        (b"k2", b"v5", "users", 0, 40, ts, 0, None),
    ]
    sink(spark.createDataFrame(more, schema), 1)
    assert [o for o, _ in offsets(sink, 0)] == [3, 9, 17, 40]
    sink.clean(force=True)
    assert offsets(sink, 0) == [(17, b"k1"), (40, b"k2")]
    assert sink.log().filter("offset = 17").first()["timestamp"] == ts.replace(tzinfo=None)
    state = sink.state().orderBy("key").collect()
    assert [(r.key, r.value) for r in state] == [(b"k1", b"v3"), (b"k2", b"v5")]


@pytest.mark.both_sessions
def test_null_keys_are_rejected_with_a_count_and_nothing_is_written(spark, lake, clock):
    path = lake / "log"
    sink = CompactedStateSink(str(path), clock=clock)
    bad = spark.createDataFrame([("a", "1"), (None, "2"), (None, "3")], "key string, value string")
    with pytest.raises(BadInputError, match="2 of 3 rows have a null key"):
        sink(bad, 0)
    assert not path.exists()  # not even an empty table
    sink(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
    with pytest.raises(BadInputError, match="1 of 2 rows have a null key"):
        sink(spark.createDataFrame([("b", "1"), (None, "2")], "key string, value string"), 1)
    assert sink.log().count() == 1


def test_schema_mismatch_names_the_column_and_writes_nothing(spark, lake, clock, delta_commits):
    path = str(lake / "log")
    sink = CompactedStateSink(path, clock=clock)
    sink(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
    versions = len(delta_commits(path))
    with pytest.raises(SchemaMismatchError, match="'value' has type int"):
        sink(spark.createDataFrame([("a", 1)], "key string, value int"), 1)
    with pytest.raises(SchemaMismatchError, match="'colour'"):
        CompactedStateSink(path, clock=clock, schema_evolution="none")(
            spark.createDataFrame([("a", "1", "red")], "key string, value string, colour string"), 1
        )
    with pytest.raises(SchemaMismatchError, match="'key'"):
        sink(spark.createDataFrame([("1",)], "value string"), 1)
    assert len(delta_commits(path)) == versions


def test_empty_first_batch_creates_the_log_and_is_remembered(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, clock=clock)
    sink(spark.createDataFrame([], "key string, value string"), 0)
    assert sink.log().count() == 0 and sink.state().count() == 0
    assert sink.dirty_ratio() == 0.0 and sink.clean(force=True) is None
    restarted = CompactedStateSink(path, clock=clock)
    restarted(spark.createDataFrame([("a", "1")], "key string, value string"), 0)
    assert restarted.last_append.skipped
    restarted(spark.createDataFrame([("a", "1")], "key string, value string"), 1)
    assert offsets(restarted) == [(0, "a")]


def test_struct_values_and_composite_keys(spark, lake, clock):
    schema = "tenant string, id int, value struct<name:string,score:double>"
    sink = CompactedStateSink(
        str(lake / "log"), key_columns=("tenant", "id"), config=NO_CLEAN, clock=clock
    )
    sink(
        spark.createDataFrame(
            [("t1", 1, ("ann", 1.0)), ("t2", 1, ("bob", 2.0)), ("t1", 2, ("cy", 3.0))], schema
        ),
        0,
    )
    sink(spark.createDataFrame([("t1", 1, ("ann", 9.0)), ("t2", 1, None)], schema), 1)
    expected = spark.createDataFrame([("t1", 1, ("ann", 9.0)), ("t1", 2, ("cy", 3.0))], schema)
    assert_df_equality(sink.state(), expected, ignore_row_order=True, ignore_nullable=True)
    stats = sink.clean(force=True)
    assert stats is not None and stats.records_read == 5 and stats.records_written == 3
    assert_df_equality(sink.state(), expected, ignore_row_order=True, ignore_nullable=True)


def test_md5_colliding_keys_both_survive_cleaning(spark, lake, clock):
    import hashlib

    # Wang & Yu's published MD5 collision: two 128-byte messages, one digest.
    a = bytes.fromhex(
        "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
        "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
        "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
        "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
    )
    b = bytes.fromhex(
        "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
        "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
        "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
        "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
    )
    assert a != b and hashlib.md5(a).digest() == hashlib.md5(b).digest()
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    schema = "key binary, value string"
    sink(spark.createDataFrame([(a, "a1"), (b, "b1")], schema), 0)
    sink(spark.createDataFrame([(a, "a2"), (b, "b2")], schema), 1)
    assert sink.clean(force=True).records_written == 2
    assert sorted((r.key, r.value) for r in sink.state().collect()) == sorted(
        [(a, "a2"), (b, "b2")]
    )


@pytest.mark.both_sessions
def test_sequence_column_orders_out_of_order_events_ties_by_offset(spark, lake, clock):
    schema = "key string, value string, seq long"
    sink = CompactedStateSink(
        str(lake / "log"), config=NO_CLEAN, sequence_column="seq", clock=clock
    )
    sink(spark.createDataFrame([("a", "new", 5), ("b", "first", 1)], schema).coalesce(1), 0)
    sink(spark.createDataFrame([("a", "old", 3), ("b", "tie-later", 1)], schema).coalesce(1), 1)
    expected = spark.createDataFrame([("a", "new"), ("b", "tie-later")], "key string, value string")
    assert_df_equality(sink.state(), expected, ignore_row_order=True, ignore_nullable=True)
    sink.clean(force=True)
    assert_df_equality(sink.state(), expected, ignore_row_order=True, ignore_nullable=True)
    assert sorted((r.key, r.offset) for r in sink.log().collect()) == [("a", 0), ("b", 3)]


def test_repeated_or_null_kafka_offsets_are_rejected(spark, lake, clock):
    """Rule 1 for Kafka input: offsets must be unique per partition; nothing is written."""
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    bad = spark.createDataFrame(
        [("a", "1", 0, 5), ("b", "1", 0, 5), ("c", "1", 1, None)],
        "key string, value string, partition int, offset long",
    )
    with pytest.raises(BadInputError, match="partition 0 has 1 rows whose 'offset' repeats") as e:
        sink(bad, 0)
    assert "1 rows of partition 1 have a null 'offset'" in str(e.value)
    assert not (lake / "log").exists()
