"""Pure planning, ported from Kafka's LogCleanerManagerTest and LogCleanerTest (no Spark)."""

from __future__ import annotations

import pytest
from testkit import segment

from sinks.cleaner.log_to_clean import (
    LogToClean,
    cleanable_offsets,
    dirty_ratio,
    filthiest_first,
    group_segments_by_size,
    log_to_clean,
    segments_to_clean,
)


def seg(base, last, size=100, *, max_ts=0, min_ts=0, horizon=None, partition=0):
    """A segment of partition 0 whose records are from epoch 0 unless told otherwise."""
    return segment(partition, base, last, size=size, min_ts=min_ts, max_ts=max_ts, horizon=horizon)


def test_cleanable_offsets_start_at_checkpoint_and_end_at_log_end():
    segments = [seg(0, 9), seg(10, 19), seg(20, 29)]
    offsets = cleanable_offsets(
        segments,
        checkpoint_dirty_offset=10,
        log_start_offset=0,
        log_end_offset=30,
        now_ms=1_000,
        min_compaction_lag_ms=0,
    )
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_offset) == (10, 30)
    assert not offsets.force_checkpoint


def test_dirty_offset_reset_when_checkpoint_above_log_end():
    # LogCleanerManagerTest.testDirtyOffsetResetIfLargerThanEndOffset
    offsets = cleanable_offsets(
        [seg(0, 9)],
        checkpoint_dirty_offset=200,
        log_start_offset=0,
        log_end_offset=10,
        now_ms=0,
        min_compaction_lag_ms=0,
    )
    assert offsets.first_dirty_offset == 0
    assert offsets.force_checkpoint
    assert log_to_clean("log", 0, [seg(0, 9)], offsets).force_checkpoint


def test_dirty_offset_reset_when_checkpoint_below_log_start():
    # LogCleanerManagerTest.testCleanableOffsetsNeedsCheckpointReset
    offsets = cleanable_offsets(
        [seg(5, 9)],
        checkpoint_dirty_offset=2,
        log_start_offset=5,
        log_end_offset=10,
        now_ms=0,
        min_compaction_lag_ms=0,
    )
    assert offsets.first_dirty_offset == 5
    assert offsets.force_checkpoint


def test_no_checkpoint_starts_at_log_start_without_forcing():
    offsets = cleanable_offsets(
        [seg(3, 9)],
        checkpoint_dirty_offset=None,
        log_start_offset=3,
        log_end_offset=10,
        now_ms=0,
        min_compaction_lag_ms=0,
    )
    assert offsets.first_dirty_offset == 3 and not offsets.force_checkpoint


def test_cleanable_offsets_for_time():
    # LogCleanerManagerTest.testCleanableOffsetsForTime: segments older than the
    # lag are cleanable, the first younger one bounds the range.
    now, lag = 10_000, 1_000
    segments = [
        seg(0, 9, max_ts=now - 5_000),
        seg(10, 19, max_ts=now - 2_000),
        seg(20, 29, max_ts=now - 10),
        seg(30, 39, max_ts=now - 5_000),
    ]
    offsets = cleanable_offsets(
        segments,
        checkpoint_dirty_offset=0,
        log_start_offset=0,
        log_end_offset=40,
        now_ms=now,
        min_compaction_lag_ms=lag,
    )
    assert offsets.first_uncleanable_offset == 20


def test_cleanable_offsets_for_time_all_young():
    now = 10_000
    offsets = cleanable_offsets(
        [seg(0, 9, max_ts=now), seg(10, 19, max_ts=now)],
        checkpoint_dirty_offset=None,
        log_start_offset=0,
        log_end_offset=20,
        now_ms=now,
        min_compaction_lag_ms=1,
    )
    assert offsets.first_uncleanable_offset == 0


def test_log_to_clean_with_uncleanable_section():
    # LogCleanerTest.testLogToCleanWithUncleanableSection: bytes at or above the
    # first uncleanable offset count in neither section.
    segments = [seg(0, 9, 100), seg(10, 19, 200), seg(20, 29, 300), seg(30, 39, 400)]
    offsets = cleanable_offsets(
        segments,
        checkpoint_dirty_offset=10,
        log_start_offset=0,
        log_end_offset=40,
        now_ms=0,
        min_compaction_lag_ms=0,
    )
    full = log_to_clean("log", 0, segments, offsets)
    assert (full.clean_bytes, full.cleanable_bytes) == (100, 900)
    partial = log_to_clean("log", 0, segments, offsets.__class__(10, 30))
    assert (partial.clean_bytes, partial.cleanable_bytes) == (100, 500)
    assert partial.cleanable_ratio == pytest.approx(500 / 600)


def test_empty_partition_has_ratio_zero():
    ltc = log_to_clean(
        "log",
        0,
        [],
        cleanable_offsets(
            [],
            checkpoint_dirty_offset=None,
            log_start_offset=0,
            log_end_offset=0,
            now_ms=0,
            min_compaction_lag_ms=0,
        ),
    )
    assert ltc.cleanable_ratio == 0.0
    assert not ltc.is_cleanable(
        now_ms=0, min_cleanable_dirty_ratio=0.0, max_compaction_lag_ms=0, force=True
    )


def _ltc(partition: int, clean: int, cleanable: int, log: str = "log", **kw) -> LogToClean:
    return LogToClean(
        log_path=log,
        partition=partition,
        first_dirty_offset=0,
        first_uncleanable_offset=0,
        clean_bytes=clean,
        cleanable_bytes=cleanable,
        **kw,
    )


def test_filthiest_log_first():
    # LogCleanerManagerTest.testGrabFilthiestCompactedLog*: highest ratio wins.
    logs = [_ltc(0, 90, 10), _ltc(1, 10, 90), _ltc(2, 50, 50, log="other")]
    assert [log.partition for log in filthiest_first(logs)] == [1, 2, 0]


def test_is_cleanable_by_ratio_lag_tombstone_and_force():
    ltc = _ltc(0, 60, 40, oldest_dirty_timestamp_ms=1_000)
    assert not ltc.is_cleanable(
        now_ms=2_000, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10_000
    )
    assert ltc.is_cleanable(
        now_ms=2_000, min_cleanable_dirty_ratio=0.3, max_compaction_lag_ms=10_000
    )
    assert ltc.is_cleanable(
        now_ms=20_000, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10_000
    )
    assert ltc.is_cleanable(
        now_ms=2_000, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10_000, force=True
    )
    stamped = _ltc(0, 100, 0, earliest_delete_horizon_ms=1_500)
    assert not stamped.is_cleanable(
        now_ms=1_500, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10**9
    )
    assert stamped.is_cleanable(
        now_ms=1_501, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10**9
    )


def test_ratio_must_exceed_threshold():
    assert not _ltc(0, 50, 50).is_cleanable(
        now_ms=0, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10**9
    )


def test_dirty_ratio_over_partitions():
    assert dirty_ratio([_ltc(0, 100, 100), _ltc(1, 300, 0)]) == pytest.approx(0.2)
    assert dirty_ratio([]) == 0.0


def test_segments_to_clean_stop_below_first_uncleanable():
    segments = [seg(20, 29), seg(0, 9), seg(10, 19)]
    assert [s.base_offset for s in segments_to_clean(segments, 20)] == [0, 10]


def test_segment_grouping():
    # LogCleanerTest.testSegmentGrouping: consecutive, every group within the
    # size limit unless a single segment exceeds it, nothing lost or reordered.
    segments = [
        seg(i * 10, i * 10 + 9, size) for i, size in enumerate([30, 30, 30, 90, 10, 200, 5])
    ]
    groups = group_segments_by_size(segments, 100)
    assert [s for g in groups for s in g] == segments
    for group in groups:
        assert len(group) == 1 or sum(s.size_bytes for s in group) <= 100
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10, 20], [30, 40], [50], [60]]
    assert group_segments_by_size([], 100) == []
    assert len(group_segments_by_size(segments, 10**9)) == 1
    assert len(group_segments_by_size(segments, 1)) == len(segments)
