"""Cleaning passes end to end: Kafka's LogCleanerTest and design.md §3 and §5–§9."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from testkit import arrow_append

from checkpoints import CleanerOffsetCheckpoint
from sinks import CleanerConfig, CompactedStateSink
from sinks.log.log_format import CHECKED_VERSION_TXN, CLEANER_OFFSET_TXN

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KV = "key string, value string"


def batch(spark, rows, schema=KV):
    return spark.createDataFrame(rows, schema).coalesce(1)


def fed(spark, sink, rows, batch_id, schema=KV):
    """``sink(batch(spark, rows, schema), batch_id)`` with the rows fed without Spark
    (`testkit.arrow_append`): the pass is under test; the tests on both sessions, the
    offsets after every file is gone and the compaction lag's hook append through Spark."""
    arrow_append(sink, rows, schema, batch_id, spark=spark)


def materialized(spark, df):
    """A DataFrame's rows now, so that it can be compared after the log changed."""
    return spark.createDataFrame(df.collect(), df.schema)


def log_rows(sink, *columns):
    return sorted(tuple(r) for r in sink.log().select(*columns).collect())


def live_paths(sink):
    return {s.path for s in sink.log_table.snapshot().all_segments()}


@pytest.mark.both_sessions
def test_clean_segments_keeps_latest_per_key_in_one_quiet_commit(spark, lake, clock, delta_commits):
    """testCleanSegments, plus design.md §3 (state), §6 (retained), §8 (checkpoint), §9."""
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1")]), 0)
    sink(batch(spark, [("a", "a2"), ("b", "b2")]), 1)
    sink(batch(spark, [("a", "a3"), ("d", "d1")]), 2)
    before = materialized(spark, sink.state())
    old_paths = live_paths(sink)

    stats = sink.clean(force=True)

    assert stats.partitions == [0] and stats.end_offsets == {0: 7}
    assert (stats.records_read, stats.records_written, stats.segments_read) == (7, 4, 3)
    assert log_rows(sink, "offset", "key", "value") == [
        (2, "c", "c1"),
        (4, "b", "b2"),
        (5, "a", "a3"),
        (6, "d", "d1"),
    ]
    assert_df_equality(sink.state(), before, ignore_row_order=True)
    # design.md §6: below E every key has at most one record
    below = sink.log().filter(F.col("offset") < 7).groupBy("key").count()
    assert below.filter("count > 1").count() == 0
    # design.md §9: one commit removes every file read and adds the new ones, dataChange=false
    actions = delta_commits(sink.path)[-1]
    removes = [a["remove"] for a in actions if "remove" in a]
    adds = [a["add"] for a in actions if "add" in a]
    assert {r["path"] for r in removes} == old_paths
    assert {a["path"] for a in adds} == live_paths(sink)
    assert all(a["dataChange"] is False for a in [*removes, *adds])
    txns = {a["txn"]["appId"]: a["txn"]["version"] for a in actions if "txn" in a}
    # and the version it was planned from, every commit before it checked for foreign changes
    assert txns == {
        CLEANER_OFFSET_TXN.format(0): 7,
        CHECKED_VERSION_TXN: len(delta_commits(sink.path)) - 2,
    }
    assert all(json_stats(a)["numRecords"] >= 1 for a in adds)
    # design.md §8: the checkpoint row holds E and the pass's figures
    row = CleanerOffsetCheckpoint(sink.checkpoint_path).read(sink.path)[(sink.path, 0)]
    assert row.first_dirty_offset == 7
    assert (row.records_read, row.records_written) == (7, 4)
    assert row.bytes_read == stats.bytes_read > 0 and row.bytes_written == stats.bytes_written > 0
    assert row.last_clean_ms == clock.now and row.last_pass_duration_ms >= 0
    # offsets keep counting after the pass (design.md §1)
    sink(batch(spark, [("e", "e1")]), 3)
    assert log_rows(sink, "offset")[-1] == (7,)


def json_stats(add):
    import json

    return json.loads(add["stats"])


@pytest.mark.both_sessions
def test_cleaning_with_deletes_and_the_delete_horizon(spark, lake, clock):
    """testCleaningWithDeletes and testCleanTombstone (KIP-534), and design.md §4's expiry."""
    retention = 1_000
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=retention)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    old = dt.datetime(1970, 1, 2)  # the records' own time plays no part
    schema = "key string, value string, timestamp timestamp"
    sink(batch(spark, [("a", "a1", old), ("b", "b1", old)], schema), 0)
    sink(batch(spark, [("a", None, old), ("c", "c1", old)], schema), 1)

    first_pass = clock.now
    sink.clean(force=True)
    tombstone = sink.log().filter("key = 'a'").collect()
    assert [(r.offset, r.value, r.delete_horizon_ms) for r in tombstone] == [
        (2, None, first_pass + retention)
    ]
    assert sorted(r.key for r in sink.state().collect()) == ["b", "c"]

    clock.advance(retention // 2)
    sink(batch(spark, [("c", "c2", old)], schema), 2)
    assert sink.clean() is None  # ratio 1.0 never passes and the horizon is ahead
    sink.clean(force=True)  # a pass before the horizon keeps it, horizon unchanged
    assert log_rows(sink, "key", "delete_horizon_ms")[0] == ("a", first_pass + retention)

    clock.advance(retention)  # now past the horizon: the partition is cleanable by itself
    assert sink.logs_to_clean()[0].has_expired_tombstones(clock.now)
    stats = sink.clean()
    assert stats is not None and stats.partitions == [0]
    assert log_rows(sink, "key", "value") == [("b", "b1"), ("c", "c2")]


def test_offsets_continue_after_every_file_is_gone(spark, lake, clock, delta_commits):
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=0)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    sink(batch(spark, [("a", None), ("b", None)]), 0)
    sink.clean(force=True)  # stamps both tombstones with horizon = now
    clock.advance(1)
    stats = sink.clean()  # expired: removes them all
    assert stats.records_written == 0 and stats.segments_written == 0
    assert live_paths(sink) == set() and sink.log().count() == 0
    restarted = CompactedStateSink(sink.path, config=config, clock=clock)
    restarted(batch(spark, [("c", "c1")]), 1)
    assert log_rows(restarted, "offset", "key") == [(2, "c")]


def test_cleaning_with_uncleanable_section(spark, lake, clock):
    """testCleaningWithUncleanableSection / testPartialSegmentClean: design.md §5's range."""
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, min_compaction_lag_ms=60_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    fed(spark, sink, [("a", "a1"), ("b", "b1")], 0)
    fed(spark, sink, [("a", "a2")], 1)
    clock.advance(120_000)
    fed(spark, sink, [("a", "a3"), ("b", "b2")], 2)
    fed(spark, sink, [("b", "b3")], 3)
    young = {s.path for s in sink.log_table.snapshot().segments[0] if s.base_offset >= 3}
    before = materialized(spark, sink.state())

    stats = sink.clean(force=True)

    assert stats.end_offsets == {0: 3} and stats.segments_read == 2
    assert young <= live_paths(sink)
    assert log_rows(sink, "offset", "key", "value") == [
        (1, "b", "b1"),
        (2, "a", "a2"),
        (3, "a", "a3"),
        (4, "b", "b2"),
        (5, "b", "b3"),
    ]
    assert_df_equality(sink.state(), before, ignore_row_order=True)
    assert sink.clean(force=True) is None  # nothing cleanable until the young files age


def test_trigger_by_ratio_exceeded_or_not(spark, lake, clock):
    """Rule 4: a partition is cleaned when its ratio exceeds the threshold, not when equal."""
    path = str(lake / "log")
    sink = CompactedStateSink(path, clock=clock)  # default threshold 0.5
    fed(spark, sink, [(f"k{i}", "v" * 50) for i in range(20)], 0)
    assert sink.last_append.clean is not None  # a fresh log is wholly dirty
    fed(spark, sink, [("k1", "w")], 1)
    ratio = sink.dirty_ratio()
    assert 0 < ratio < 1

    def with_threshold(threshold):
        return CompactedStateSink(
            path, config=CleanerConfig(min_cleanable_dirty_ratio=threshold), clock=clock
        )

    assert with_threshold(ratio).clean() is None
    stats = with_threshold(ratio - 0.01).clean()
    assert stats is not None and stats.records_read == 21 and stats.records_written == 20
    assert sink.dirty_ratio() == 0.0


def test_trigger_by_max_compaction_lag(spark, lake, clock):
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=10_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    sink(batch(spark, [("a", "1"), ("a", "2")]), 0)
    assert sink.last_append.clean is None and sink.clean() is None
    clock.advance(10_001)
    sink(batch(spark, [], KV), 1)  # the hook cleans what has waited too long
    assert sink.last_append.clean is not None
    assert log_rows(sink, "offset", "value") == [(1, "2")]


def test_filthiest_partition_is_cleaned_and_stats_cover_every_partition(spark, lake, clock):
    """grabFilthiestCompactedLog: only partitions above the threshold, dirtiest first."""
    schema = "key string, value string, partition int"
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [(f"k{i}", "v" * 40, 0) for i in range(30)], 0, schema)
    sink.clean(force=True)
    fed(spark, sink, [("k1", "x", 0), ("j1", "x", 1), ("j1", "y", 1)], 1, schema)
    ratios = {log.partition: log.cleanable_ratio for log in sink.logs_to_clean()}
    assert ratios[1] == 1.0 and ratios[0] < 0.5
    picky = CompactedStateSink(
        sink.path, config=CleanerConfig(min_cleanable_dirty_ratio=0.5), clock=clock
    )
    assert picky.clean().partitions == [1]
    fed(spark, sink, [("j1", "z", 1)], 2, schema)
    stats = sink.clean(force=True)
    assert stats.partitions == [0, 1] and stats.end_offsets == {0: 31, 1: 3}
    rows = CleanerOffsetCheckpoint(sink.checkpoint_path).read(sink.path)
    assert {p: e.first_dirty_offset for (_, p), e in rows.items()} == {0: 31, 1: 3}


def test_dirty_offset_reset_when_checkpoint_lies_above_the_log_end(spark, lake, clock):
    """LogCleanerManagerTest: a checkpoint above the log end restarts at the log start."""
    from checkpoints import CheckpointEntry

    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", "1"), ("a", "2"), ("b", "1")], 0)
    checkpoint = CleanerOffsetCheckpoint(sink.checkpoint_path)
    checkpoint.write([CheckpointEntry(log_path=sink.path, partition=0, first_dirty_offset=2)])
    assert sink.logs_to_clean()[0].first_dirty_offset == 2
    checkpoint.write([CheckpointEntry(log_path=sink.path, partition=0, first_dirty_offset=99)])
    assert sink.logs_to_clean()[0].first_dirty_offset == 0
    assert sink.clean() is None  # nothing cleanable, but the reset is checkpointed
    assert checkpoint.read(sink.path)[(sink.path, 0)].first_dirty_offset == 0
    stats = sink.clean(force=True)
    assert stats.first_dirty_offsets == {0: 0} and stats.records_written == 2


def test_dirty_offset_reset_when_checkpoint_lies_below_the_log_start(spark, lake, clock):
    """A checkpoint below the log start offset (moved by retention) restarts at the start."""
    from checkpoints import CheckpointEntry
    from sinks.log.log_table import LOG_START_OFFSET_TXN

    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    fed(spark, sink, [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")], 0)
    CleanerOffsetCheckpoint(sink.checkpoint_path).write(
        [CheckpointEntry(log_path=sink.path, partition=0, first_dirty_offset=1)]
    )
    # what retention's DeleteRecords commits: a new log start offset, no data change
    sink.log_table.snapshot().commit(
        data_change=False, transactions={LOG_START_OFFSET_TXN.format(0): 2}, info={}
    )
    assert sink.logs_to_clean()[0].first_dirty_offset == 2
    stats = sink.clean(force=True)
    assert stats.first_dirty_offsets == {0: 2} and stats.end_offsets == {0: 4}
    assert log_rows(sink, "offset", "key") == [(2, "a"), (3, "c")]


def test_segment_grouping_end_to_end(spark, lake, clock):
    """testSegmentGrouping: a pass writes several files, each within segment.bytes."""

    def noise(i):  # incompressible text, so that file sizes follow the record count
        return "".join(hashlib.sha256(f"{i}/{j}".encode()).hexdigest() for j in range(8))

    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, segment_bytes=14_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    for b in range(5):
        fed(spark, sink, [(f"k{b}-{i}", noise(i + 10 * b)) for i in range(10)], b)
    fed(spark, sink, [(f"big{i}", noise(100 + i)) for i in range(40)], 5)
    inputs = sink.log_table.snapshot().segments[0]
    largest = max(s.size_bytes for s in inputs)
    assert largest > config.segment_bytes > min(s.size_bytes for s in inputs) * 2
    stats = sink.clean(force=True)
    outputs = sink.log_table.snapshot().segments[0]
    assert stats.records_written == 90 and 1 < len(outputs) < len(inputs)
    assert all(s.size_bytes <= max(config.segment_bytes, largest) for s in outputs)
    assert sum(s.size_bytes > config.segment_bytes for s in outputs) <= 1
