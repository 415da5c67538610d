"""Cleaner states through the sink: a failing pass is marked uncleanable and retried; pauses."""

from __future__ import annotations

import os

import pytest
from testkit import batch_frame, replay, state_of

from sinks import CleanerConfig, CleanerError, CompactedStateSink
from sinks.cleaner.cleaner_manager import BACKOFF_BASE_MS


def rows_by_partition(sink):
    return {p: e for (_, p), e in sink.checkpoints.read(sink.path).items()}


def test_failing_pass_is_marked_uncleanable_and_retried_with_backoff(spark, lake, clock):
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    for b in range(2):
        sink(batch_frame(spark, b), b)
    victim = os.path.join(sink.path, sink.log_table.snapshot().segments[0][0].path)
    os.rename(victim, victim + ".away")  # a segment the pass must read is unreadable

    with pytest.raises(CleanerError, match="marked uncleanable"):
        sink.clean(force=True)
    rows = rows_by_partition(sink)
    assert {rows[p].cleaner_state for p in (0, 1)} == {"uncleanable"}
    assert rows[0].failed_attempts == 1 and rows[0].uncleanable_reason
    assert sink.clean(force=True) is None  # backing off, not hammering
    sink(batch_frame(spark, 2), 2)  # appends go on; the hook's pass is skipped too

    clock.advance(BACKOFF_BASE_MS)
    with pytest.raises(CleanerError):
        sink.clean(force=True)  # retried after the backoff, and failed again
    assert rows_by_partition(sink)[0].failed_attempts == 2

    os.rename(victim + ".away", victim)
    clock.advance(BACKOFF_BASE_MS)
    assert sink.clean(force=True) is None  # the second backoff is twice as long
    clock.advance(BACKOFF_BASE_MS)
    stats = sink.clean(force=True)
    assert stats is not None and set(stats.partitions) == {0, 1}
    rows = rows_by_partition(sink)
    assert {(rows[p].cleaner_state, rows[p].failed_attempts) for p in (0, 1)} == {("idle", 0)}
    assert rows[0].uncleanable_reason is None
    assert state_of(sink) == replay(range(3)).state


def test_paused_partitions_are_not_cleaned_until_resumed(spark, lake, clock):
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    for b in range(2):
        sink(batch_frame(spark, b), b)
    sink.pause_cleaning([0])
    stats = sink.clean(force=True)
    assert stats is not None and stats.partitions == [1]
    assert rows_by_partition(sink)[0].cleaner_state == "paused"
    sink.pause_cleaning()
    assert sink.clean(force=True) is None
    sink.resume_cleaning()
    stats = sink.clean(force=True)
    assert stats is not None and stats.partitions == [0]
    assert state_of(sink) == replay(range(2)).state
