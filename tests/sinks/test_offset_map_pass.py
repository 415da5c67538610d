"""Kafka's pass: the offset map of the dirty section, then one recopy of every input file.

Each pass is checked against the reference rule (latest record per key over the
whole cleanable range, then KIP-534) and against the Spark path it replaces where
it can run; the per-pass byte budget and the Throttler are checked on real logs.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.clean_segments import apply_tombstone_rules, retained_mask
from sinks.cleaner.cleaner import retain_latest
from sinks.cleaner.offset_map import dirty_segments, is_mappable
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE
from sinks.log.segment import Segment

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


@pytest.fixture
def log_copy(template, tmp_path):
    lake, now = template
    shutil.copytree(lake, tmp_path / "lake")
    clock = Clock(now)
    return str(tmp_path / "lake" / "log"), clock


def reference(sink: CompactedStateSink, pass_start_ms: int):
    return retain_latest(
        sink.log(),
        key_columns=[PARTITION, *KEYS],
        sequence_column=None,
        pass_start_ms=pass_start_ms,
        delete_retention_ms=RETENTION,
    )


def ordered(df):
    return df.orderBy(PARTITION, OFFSET)


def rows(df):
    return [r.asDict() for r in df.collect()]


@pytest.mark.parametrize("path", ["offset_map", "spark"])
def test_pass_equals_the_reference_rule(spark, log_copy, path):
    location, clock = log_copy
    sink = open_log(location, clock)
    if path == "spark":
        sink.cleaner.offset_map_max_records = 0
    snapshot = sink.log_table.snapshot()
    assert sink.cleaner.uses_offset_map(snapshot, snapshot.all_segments()) == (path != "spark")
    expected = rows(ordered(reference(sink, clock.now)))
    state = sink.state().collect()
    stats = sink.clean(force=True)
    assert stats is not None and stats.records_written < stats.records_read
    assert rows(ordered(sink.log())) == expected
    assert sorted(sink.state().collect()) == sorted(state)
    assert sink.dirty_ratio() == 0.0


def test_pass_reads_each_input_file_once_and_writes_what_the_spark_path_writes(spark, log_copy):
    location, clock = log_copy
    fast = open_log(location, clock)
    shutil.copytree(location, location + "-spark")
    slow = open_log(location + "-spark", clock)
    slow.cleaner.offset_map_max_records = 0
    a, b = fast.clean(force=True), slow.clean(force=True)
    assert (a.records_read, a.records_written, a.segments_written) == (
        b.records_read,
        b.records_written,
        b.segments_written,
    )
    columns = [c for c in fast.log().columns]
    assert_df_equality(ordered(fast.log()).select(columns), ordered(slow.log()).select(columns))


def test_sequence_columns_and_float_keys_take_the_spark_path():
    assert is_mappable(pa.string()) and is_mappable(pa.int32()) and is_mappable(pa.binary())
    assert not is_mappable(pa.float64()) and not is_mappable(pa.struct([("a", pa.int32())]))


# -- pure pieces -----------------------------------------------------------------------------


def seg(base: int, last: int) -> Segment:
    return Segment(
        partition=0,
        base_offset=base,
        last_offset=last,
        path=f"{base}",
        size_bytes=1,
        num_records=last - base + 1,
    )


def test_dirty_section_starts_below_the_recorded_cleaner_offset():
    segments = [seg(0, 9), seg(10, 19), seg(20, 29)]
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=20) == segments[2:]
    # a checkpoint ahead of what the log records: trust only the log's own offset
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=10) == segments[1:]
    assert dirty_segments(segments, first_dirty_offset=20, cleaner_offset=None) == segments
    assert dirty_segments(segments, first_dirty_offset=15, cleaner_offset=20) == segments[1:]


def test_retained_mask_keeps_records_the_map_holds_no_newer_offset_for():
    offsets = np.array([1, 2, 3, 7, 8])
    positions = np.array([-1, 0, 1, 0, 1])  # key of offset 1 is not in the map
    map_offsets = np.array([7, 3])
    assert retained_mask(offsets, positions, map_offsets).tolist() == [
        True,
        False,
        True,
        True,
        True,
    ]


def test_tombstone_rules_over_arrow():
    table = pa.table(
        {
            VALUE: pa.array(["a", None, None, None], pa.string()),
            DELETE_HORIZON_MS: pa.array([None, None, 50, 500], pa.int64()),
        }
    )
    out = apply_tombstone_rules(table, pass_start_ms=100, delete_retention_ms=10)
    assert out.column(VALUE).to_pylist() == ["a", None, None]
    assert out.column(DELETE_HORIZON_MS).to_pylist() == [None, 110, 500]


# -- the per-pass byte budget and the Throttler ----------------------------------------------


def test_a_budget_cuts_the_pass_into_steps_that_end_in_the_same_log(spark, log_copy):
    location, clock = log_copy
    whole = open_log(location + "-whole", clock)
    shutil.copytree(location, location + "-whole")
    whole.clean(force=True)
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
    assert sorted(sink.log().drop(DELETE_HORIZON_MS).collect()) == sorted(
        whole.log().drop(DELETE_HORIZON_MS).collect()
    )


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
    b = capped.log_cleaner.clean(spark, force=True, max_tasks=1, niceness=10)
    assert b is not None and (a.records_written, a.segments_written) == (
        b.records_written,
        b.segments_written,
    )
    assert sorted(whole.log().collect()) == sorted(capped.log().collect())
