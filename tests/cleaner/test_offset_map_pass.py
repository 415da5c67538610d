"""Kafka's pass: each partition's offset map built in its task, then one recopy of its files.

Each pass is checked against the reference rule (latest record per key over the
whole cleanable range, then KIP-534); the map's bound (``log.cleaner.dedupe.buffer.size``),
the per-pass byte budget and the Throttler are checked on real logs.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from testkit import segment

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.offset_map import (
    BYTES_PER_MAPPED_RECORD,
    MAX_MAP_BUCKETS,
    OffsetMap,
    canonical_keys,
    dirty_segments,
    map_buckets,
    map_end_offset,
    size_map,
)
from sinks.cleaner.pass_planning import RoundRequest
from sinks.cleaner.recopy_task import PartitionToClean, packed, partitions_to_clean
from sinks.cleaner.rules import apply_arrow_tombstone_rules, retain_latest
from sinks.cleaner.throttler import TaskBudget
from sinks.log.log_keys import LogKeys
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE

RETENTION = 1_000
SCHEMA = "k1 string, k2 int, value string, partition int"
KEYS = ("k1", "k2")


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_log(path: str, clock: Clock, **config: object) -> CompactedStateSink:
    settings = {"min_cleanable_dirty_ratio": 1.0, "delete_retention_ms": RETENTION, **config}
    return CompactedStateSink(
        path,
        key_columns=KEYS,
        config=CleanerConfig(**settings),  # type: ignore[arg-type]
        clock=clock,
        cleaning="inline",
    )


@pytest.fixture(scope="module")
def template(classic_spark, tmp_path_factory):
    """Three partitions, composite keys, a clean section with stamped tombstones, a dirty
    tail that supersedes some of them, and a log start offset inside partition 1."""
    lake = tmp_path_factory.mktemp("offset-map-pass")
    clock = Clock(1_700_000_000_000)
    sink = open_log(str(lake / "log"), clock)

    def append(rows, batch_id):
        sink(classic_spark.createDataFrame(rows, SCHEMA).coalesce(1), batch_id)

    append([(f"k{i % 7}", i % 3, f"v{i}", i % 3) for i in range(60)], 0)
    append([("k1", 1, None, 1), ("k2", 2, None, 2), ("k5", 2, None, 2), ("k6", 0, "a", 0)], 1)
    sink.clean(force=True)  # the clean section; tombstones stamped with now + RETENTION
    append([("k5", 2, "back", 2), ("k6", 0, None, 0), ("k0", 0, "x", 0), ("k0", 0, "y", 0)], 2)
    append([(f"k{i % 4}", i % 2, f"w{i}", i % 3) for i in range(20)], 3)
    append([("new", 9, "n", 1), ("k3", 0, None, 0)], 4)
    sink.delete_records(1, 12)
    return lake, clock.now + 2 * RETENTION  # the stamped horizons lie in the past


@pytest.fixture(scope="module")
def whole_log(template, tmp_path_factory):
    """The template cleaned in one unbounded pass: the log every bounded pass must end in
    (built once for the tests that compare against it)."""
    lake, now = template
    copy = tmp_path_factory.mktemp("offset-map-pass-whole") / "lake"
    shutil.copytree(lake, copy)
    whole = open_log(str(copy / "log"), Clock(now))
    whole.clean(force=True)
    return sorted(whole.log().drop(DELETE_HORIZON_MS).collect())


@pytest.fixture
def log_copy(template, tmp_path):
    lake, now = template
    shutil.copytree(lake, tmp_path / "lake")
    clock = Clock(now)
    return str(tmp_path / "lake" / "log"), clock


def reference(sink: CompactedStateSink, pass_start_ms: int):
    return retain_latest(
        sink.log(),
        keys=LogKeys(key_columns=(PARTITION, *KEYS)),
        pass_start_ms=pass_start_ms,
        delete_retention_ms=RETENTION,
    )


def ordered(df):
    return df.orderBy(PARTITION, OFFSET)


def rows(df):
    return [r.asDict() for r in df.collect()]


@pytest.mark.parametrize("segment_bytes", [10**9, 1], ids=["one-group", "group-per-file"])
def test_pass_equals_the_reference_rule(spark, log_copy, segment_bytes):
    location, clock = log_copy
    sink = open_log(location, clock)
    sink.cleaner.segment_bytes = segment_bytes  # a partition's groups then split over tasks
    expected = rows(ordered(reference(sink, clock.now)))
    state = sink.state().collect()
    stats = sink.clean(force=True)
    assert stats is not None and stats.records_written < stats.records_read
    assert not stats.work_left
    assert rows(ordered(sink.log())) == expected
    assert sorted(sink.state().collect()) == sorted(state)
    assert sink.dirty_ratio() == 0.0


def test_a_tiny_dedupe_buffer_cleans_in_passes_that_end_where_the_map_fills(
    spark, log_copy, whole_log
):
    location, clock = log_copy
    sink = open_log(location, clock, dedupe_buffer_size=BYTES_PER_MAPPED_RECORD)  # one record
    state = sorted(sink.state().collect())
    ends = sink.log_table.snapshot().log_end_offsets()
    steps = []
    while (stats := sink.clean(force=True)) is not None:
        steps.append(stats)
        assert sorted(sink.state().collect()) == state  # unchanged after every pass
        assert len(steps) < 50
    assert len(steps) > 1 and steps[0].work_left and not steps[-1].work_left
    first = steps[0]
    assert any(first.end_offsets[p] < ends[p] for p in first.end_offsets)  # stopped short
    checkpoint = sink.log_table.snapshot()
    for p, end in steps[-1].end_offsets.items():
        assert checkpoint.cleaner_offset(p) == end == ends[p]
    assert sink.dirty_ratio() == 0.0
    assert sorted(sink.log().drop(DELETE_HORIZON_MS).collect()) == whole_log


def test_a_dirty_section_too_large_to_map_at_once_is_mapped_in_buckets_in_one_pass(
    spark, log_copy, whole_log
):
    location, clock = log_copy
    sink = open_log(location, clock, dedupe_buffer_size=BYTES_PER_MAPPED_RECORD * 4)
    state = sorted(sink.state().collect())
    snapshot = sink.log_table.snapshot()
    partitions = sink.log_cleaner.planner.plan(snapshot).partitions
    plans = sink.cleaner.partition_plans(snapshot, partitions)
    assert max(plan.buckets for plan in plans) > 1  # the map is built a bucket at a time
    stats = sink.clean(force=True)
    assert stats is not None and not stats.work_left  # one pass, nothing cut
    assert sorted(sink.state().collect()) == state
    assert sorted(sink.log().drop(DELETE_HORIZON_MS).collect()) == whole_log


# -- pure pieces -----------------------------------------------------------------------------


def test_dirty_section_starts_below_the_recorded_cleaner_offset():
    segments = [segment(0, 0, 9), segment(0, 10, 19), segment(0, 20, 29)]
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=20) == segments[2:]
    # a checkpoint ahead of what the log records: trust only the log's own offset
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=10) == segments[1:]
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=None) == segments
    assert dirty_segments(segments, first_dirty_offset=15, cleaner_offset=20) == segments[1:]


def test_the_map_fills_segment_by_segment_and_always_takes_one_dirty_segment():
    segments = [segment(0, 0, 9), segment(0, 10, 19), segment(0, 20, 29)]  # 10 records each
    assert map_end_offset(segments, 25, 30, first_dirty_offset=0) == 20
    assert map_end_offset(segments, 30, 30, first_dirty_offset=0) == 30
    assert map_end_offset(segments, 1, 30, first_dirty_offset=0) == 10  # progress
    # a sequence column maps the clean section too: always taken, then one dirty segment
    assert map_end_offset(segments, 1, 30, first_dirty_offset=10) == 20


def test_the_map_is_built_at_once_in_buckets_or_cut_where_it_fills():
    clean = [segment(0, 0, 9)]
    dirty = [segment(0, 10, 19), segment(0, 20, 29), segment(0, 30, 39)]  # 10 records each
    inputs = clean + dirty

    def size(buffer, sequence_column=None):
        return size_map(
            inputs,
            first_dirty_offset=10,
            cleaner_offset=10,
            keys=LogKeys(key_columns=("key",), sequence_column=sequence_column),
            end_offset=40,
            dedupe_buffer_size=buffer,
        )

    at_once = size(30 * BYTES_PER_MAPPED_RECORD)  # the dirty section fits: keys held
    assert at_once.mapped == tuple(dirty) and at_once.buckets == 1 and at_once.end_offset == 40
    bucketed = size(20 * BYTES_PER_MAPPED_RECORD)  # every input, in buckets
    assert bucketed.mapped == tuple(inputs) and bucketed.buckets == 3
    assert bucketed.end_offset == 40
    cut = size(BYTES_PER_MAPPED_RECORD)  # not even in buckets: Kafka's bound
    assert cut.mapped == tuple(dirty[:1]) and cut.end_offset == 20 and cut.buckets == 1
    sequenced = size(30 * BYTES_PER_MAPPED_RECORD, "seq")  # a sequence maps the clean too
    assert sequenced.mapped == tuple(inputs) and sequenced.end_offset == 40
    assert map_buckets(1000, 1000) is None  # the offsets alone do not fit
    assert map_buckets(10, 10 * BYTES_PER_MAPPED_RECORD + 80) == 1
    assert map_buckets(10, BYTES_PER_MAPPED_RECORD) is None  # more than MAX_MAP_BUCKETS
    assert map_buckets(10, 10 * BYTES_PER_MAPPED_RECORD // MAX_MAP_BUCKETS + 80) == 8


def test_a_partition_is_cleaned_whole_by_one_task_that_maps_it_once():
    a, b, c = (segment(0, base, base + 9, path=str(base), size=1) for base in (0, 10, 20))
    [whole] = partitions_to_clean({0: [b, c]}, {0: [[a], [b], [c]]})
    assert whole.groups == (("0",), ("10",), ("20",)) and whole.mapped == ("10", "20")
    assert whole.size_bytes == 3


def test_small_partitions_are_packed_into_one_spark_task_per_core():
    sizes = [50, 40, 30, 20, 10]
    tasks = [PartitionToClean(p, (), (), size) for p, size in enumerate(sizes)]
    bins = packed(tasks, 2)
    assert sorted(i for b in bins for i in b) == [0, 1, 2, 3, 4] and len(bins) == 2
    assert sorted(sum(sizes[i] for i in b) for b in bins) == [70, 80]
    assert packed(tasks[:1], 4) == [[0]]


def test_the_offset_map_keeps_each_keys_newest_offset_exactly():
    keys = pa.table({"k": ["a", "b", "a", "c"]})
    encoded = canonical_keys(keys, ["k"], every_validity=True)
    offset_map = OffsetMap.build(encoded, pa.chunked_array([pa.array([1, 2, 3, 4])]))
    assert offset_map.size == 3
    assert offset_map.is_newest(np.array([1, 2, 3, 4])).tolist() == [False, True, True, True]
    assert offset_map.lacks(pa.table({"k": ["a", "z"]})).tolist() == [False, True]


def test_tombstone_rules_over_arrow():
    table = pa.table(
        {
            VALUE: pa.array(["a", None, None, None], pa.string()),
            DELETE_HORIZON_MS: pa.array([None, None, 50, 500], pa.int64()),
        }
    )
    out = apply_arrow_tombstone_rules(table, pass_start_ms=100, delete_retention_ms=10)
    assert out.column(VALUE).to_pylist() == ["a", None, None]
    assert out.column(DELETE_HORIZON_MS).to_pylist() == [None, 110, 500]


# -- the per-pass byte budget and the Throttler ----------------------------------------------


def test_a_budget_cuts_the_pass_into_steps_that_end_in_the_same_log(spark, log_copy, whole_log):
    location, clock = log_copy
    snapshot = open_log(location, clock).log_table.snapshot()
    smallest = min(s.size_bytes for s in snapshot.all_segments())
    sink = open_log(location, clock, log_cleaner_max_bytes_per_pass=smallest)
    state = sorted(sink.state().collect())
    steps = []
    while (stats := sink.clean(force=True)) is not None:
        steps.append(stats)
        assert stats.budget_bytes == smallest and "budget" in stats.summary()
        assert len(steps) < 50
    assert len(steps) > 2 and steps[0].work_left and not steps[-1].work_left
    assert sorted(sink.state().collect()) == state
    assert sink.dirty_ratio() == 0.0
    assert sorted(sink.log().drop(DELETE_HORIZON_MS).collect()) == whole_log


def test_the_worker_keeps_going_while_the_budget_left_work(spark, log_copy):
    location, clock = log_copy
    smallest = min(
        s.size_bytes for s in open_log(location, clock).log_table.snapshot().all_segments()
    )
    sink = open_log(
        location, clock, log_cleaner_max_bytes_per_pass=smallest, min_cleanable_dirty_ratio=0.0
    )
    passes = []
    sink.add_pass_listener(passes.append)
    sink.log_cleaner.wakeup(spark)
    assert sink.await_cleaner(timeout_s=300)
    sink.close()
    assert len(passes) > 2 and passes[0].work_left and not passes[-1].work_left
    assert sink.dirty_ratio() == 0.0


def test_a_pass_capped_to_one_niced_task_writes_the_same_log(spark, log_copy):
    location, clock = log_copy
    shutil.copytree(location, location + "-capped")
    whole, capped = open_log(location, clock), open_log(location + "-capped", clock)
    whole.cleaner.segment_bytes = capped.cleaner.segment_bytes = 1  # a group per input file
    a = whole.clean(force=True)
    b = capped.cleaner.run_pass(spark, RoundRequest(force=True, budget=TaskBudget(1, 10)))
    assert b is not None and (a.records_written, a.segments_written) == (
        b.records_written,
        b.segments_written,
    )
    assert sorted(whole.log().collect()) == sorted(capped.log().collect())
