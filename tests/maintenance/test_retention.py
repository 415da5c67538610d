"""Retention through the sink: cleanup.policy delete and compact,delete, and delete_records."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from testkit import (
    assert_offsets_unique,
    batch_frame,
    batch_rows,
    live_offsets,
    replay,
    state_of,
)

from sinks import CleanerConfig, CompactedStateSink, OffsetOutOfRangeError


def visible_offsets(sink) -> dict[int, list[int]]:
    rows = sink.log().select("partition", "offset").collect()
    found: dict[int, list[int]] = {}
    for r in rows:
        found.setdefault(r["partition"], []).append(r["offset"])
    return {p: sorted(o) for p, o in found.items()}


def appended_per_partition(batches) -> dict[int, int]:
    counts: dict[int, int] = {}
    for b in batches:
        for *_, p in batch_rows(b):
            counts[p] = counts.get(p, 0) + 1
    return counts


def test_delete_policy_drops_expired_files_oldest_first_and_offsets_keep_counting(
    spark, lake, clock
):
    config = CleanerConfig(cleanup_policy="delete", retention_ms=10_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    for b in range(3):
        sink(batch_frame(spark, b), b)  # records are stamped with the clock at append
        clock.advance(6_000)
    # At the third append (t0 + 12 s) batch 0's files (newest record t0) were older than 10 s.
    first_of_batch_1 = appended_per_partition([0])
    snapshot = sink.log_table.snapshot()
    assert {p: snapshot.log_start_offset(p) for p in (0, 1)} == first_of_batch_1
    assert state_of(sink) == replay([1, 2]).state
    assert min(visible_offsets(sink)[0]) == first_of_batch_1[0]
    assert all(min(o) >= first_of_batch_1[p] for p, o in live_offsets(sink.path).items())
    assert DeltaTable(sink.path).history(10)[0]["operation"] != "OPTIMIZE"

    clock.advance(60_000)  # everything expired: each partition still keeps its newest file
    assert sink.clean() is None  # delete policy: no compaction, retention only
    assert {p: len(s) for p, s in sink.log_table.snapshot().segments.items()} == {0: 1, 1: 1}
    assert state_of(sink) == replay([2]).state
    sink(batch_frame(spark, 3), 3)
    ends = sink.log_table.snapshot().log_end_offsets()
    assert ends == appended_per_partition(range(4))  # offsets kept counting


def test_compact_delete_with_retention_bytes_keeps_at_least_the_limit(spark, lake, clock):
    config = CleanerConfig(
        cleanup_policy="compact,delete", retention_bytes=4_000, min_cleanable_dirty_ratio=1.0
    )
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    for b in range(6):
        sink(batch_frame(spark, b), b)
    snapshot = sink.log_table.snapshot()
    for p, segments in snapshot.segments.items():
        total = sum(s.size_bytes for s in segments)
        assert total >= 4_000 or len(segments) == 1
        assert total - segments[0].size_bytes < 4_000  # one more file would break the limit
        assert snapshot.log_start_offset(p) == segments[0].base_offset > 0
    assert sink.clean(force=True) is not None  # compaction still works under retention
    assert_offsets_unique(sink.path)
    kept = {p: snapshot.log_start_offset(p) for p in (0, 1)}
    expected = {}
    for b in range(6):  # the oracle over the records at or above each log start offset
        for key, value, p in batch_rows(b):
            expected.setdefault(p, []).append((key, value))
    oracle = {}
    for p, records in expected.items():
        for key, value in records[kept[p] :]:
            if value is None:
                oracle.pop(key, None)
            else:
                oracle[key] = value
    assert state_of(sink) == oracle


@pytest.mark.both_sessions
def test_delete_records_hides_at_once_drops_files_and_is_idempotent(spark, lake, clock):
    sink = CompactedStateSink(
        str(lake / "log"), config=CleanerConfig(min_cleanable_dirty_ratio=1.0), clock=clock
    )
    for b in range(3):
        sink(batch_frame(spark, b), b)
    per_batch = appended_per_partition([0])[0]
    middle = per_batch + 3  # inside batch 1's file of partition 0
    before = len(sink.log_table.snapshot().segments[0])

    sink.delete_records(0, middle)

    assert min(visible_offsets(sink)[0]) == middle
    snapshot = sink.log_table.snapshot()
    assert snapshot.log_start_offset(0) == middle
    assert len(snapshot.segments[0]) == before - 1  # only batch 0's file lay wholly below
    assert {e.cleaner_state for e in sink.checkpoints.read(sink.path).values()} <= {"idle"}
    version = snapshot.version
    sink.delete_records(0, middle)
    sink.delete_records(0, 1)  # never moves back
    assert sink.log_table.snapshot().version == version
    with pytest.raises(OffsetOutOfRangeError):
        sink.delete_records(0, 10_000)

    end = snapshot.log_end_offset(0)
    sink.delete_records(0, end)  # every record of partition 0 goes, and every file
    assert 0 not in sink.log_table.snapshot().segments
    assert 0 not in visible_offsets(sink)
    sink(batch_frame(spark, 3), 3)
    assert min(visible_offsets(sink)[0]) == end  # offsets continue after deleting every file
    assert sink.clean(force=True) is not None
    assert_offsets_unique(sink.path)
