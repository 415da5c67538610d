"""Retention planning (pure): the whole files retention.ms, retention.bytes, DeleteRecords drop."""

from __future__ import annotations

import pytest
from testkit import segment

from sinks import OffsetOutOfRangeError
from sinks.maintenance.retention import plan_delete_records, plan_retention

NOW = 1_000_000


def seg(partition, base, last, *, size=100, newest_ms=NOW):
    """A segment whose newest record is ``newest_ms`` (default: now, so not expired)."""
    return segment(partition, base, last, size=size, min_ts=newest_ms - 10, max_ts=newest_ms)


def plan(segments, *, starts=None, retention_ms=-1, retention_bytes=-1):
    by_partition = {}
    for s in segments:
        by_partition.setdefault(s.partition, []).append(s)
    return plan_retention(
        by_partition,
        log_start_offsets=starts or {},
        now_ms=NOW,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
    )


def bases(plan_, partition=0):
    return [s.base_offset for s in plan_.removes.get(partition, ())]


def test_time_retention_removes_expired_prefix_oldest_first():
    files = [seg(0, 0, 9, newest_ms=100), seg(0, 10, 19, newest_ms=200), seg(0, 20, 29)]
    p = plan(files, retention_ms=NOW - 300)
    assert bases(p) == [0, 10]
    assert p.log_start_offsets == {0: 20}
    assert p.reasons[0] == ("retention.ms",)


def test_time_retention_stops_at_first_file_not_expired():
    files = [
        seg(0, 0, 9, newest_ms=100),
        seg(0, 10, 19),
        seg(0, 20, 29, newest_ms=100),
        seg(0, 30, 39),
    ]
    assert bases(plan(files, retention_ms=NOW - 300)) == [0]


def test_never_the_newest_file_even_when_everything_expired():
    files = [seg(0, 0, 9, newest_ms=1), seg(0, 10, 19, newest_ms=2)]
    p = plan(files, retention_ms=0, retention_bytes=0)
    assert bases(p) == [0]
    assert p.log_start_offsets == {0: 10}


def test_single_file_partition_is_never_retained_away():
    assert plan([seg(0, 0, 9, newest_ms=1)], retention_ms=0, retention_bytes=0).is_empty


def test_size_retention_per_partition_like_kafka():
    files = [seg(0, b, b + 9, size=100) for b in (0, 10, 20, 30)] + [seg(1, 0, 9, size=1000)]
    p = plan(files, retention_bytes=250)
    # Kafka's rule: a file goes only while the rest still holds retention.bytes:
    # 400 B -> 300 B; dropping the next would leave 200 B < 250 B.
    assert bases(p, 0) == [0]
    assert 1 not in p.removes  # partition 1 has a single (newest) file
    assert p.reasons[0] == ("retention.bytes",)


def test_size_retention_after_time_retention():
    files = [seg(0, 0, 9, newest_ms=1, size=100)] + [
        seg(0, b, b + 9, size=100) for b in (10, 20, 30)
    ]
    p = plan(files, retention_ms=NOW - 2, retention_bytes=150)
    assert bases(p) == [0, 10]  # 300 B left after time retention, 150 B may go
    assert p.reasons[0] == ("retention.ms", "retention.bytes")
    assert p.bytes == 200 and p.records == 20


def test_disabled_policies_plan_nothing():
    files = [seg(0, 0, 9, newest_ms=1), seg(0, 10, 19)]
    assert plan(files).is_empty


def test_files_below_the_log_start_offset_go_first():
    files = [seg(0, 0, 9), seg(0, 10, 19), seg(0, 20, 29)]
    p = plan(files, starts={0: 15})
    assert bases(p) == [0]
    assert p.log_start_offsets == {}  # 15 is already the start; the next file straddles it
    assert p.reasons[0] == ("log-start-offset",)


def test_file_without_timestamp_statistics_is_not_expired():
    odd = segment(0, 0, 9, path="partition-0/x.parquet")
    assert plan([odd, seg(0, 10, 19)], retention_ms=0).is_empty


def test_compacted_files_with_gaps_move_start_to_next_base():
    files = [seg(0, 0, 40, newest_ms=1), seg(0, 57, 90)]
    assert plan(files, retention_ms=0).log_start_offsets == {0: 57}


def test_delete_records_moves_start_and_drops_files_wholly_below():
    files = [seg(0, 0, 9), seg(0, 10, 19), seg(0, 20, 29)]
    p = plan_delete_records(
        files, partition=0, before_offset=15, log_start_offset=0, log_end_offset=30
    )
    assert bases(p) == [0]
    assert p.log_start_offsets == {0: 15}


def test_delete_records_up_to_log_end_drops_every_file():
    files = [seg(0, 0, 9), seg(0, 10, 19)]
    p = plan_delete_records(
        files, partition=0, before_offset=20, log_start_offset=0, log_end_offset=20
    )
    assert bases(p) == [0, 10]
    assert p.log_start_offsets == {0: 20}


def test_delete_records_is_idempotent_and_never_moves_back():
    files = [seg(0, 10, 19)]
    kwargs = dict(partition=0, log_start_offset=12, log_end_offset=20)
    assert plan_delete_records(files, before_offset=12, **kwargs).is_empty
    assert plan_delete_records(files, before_offset=5, **kwargs).is_empty


def test_delete_records_beyond_log_end_is_refused():
    with pytest.raises(OffsetOutOfRangeError, match="log end offset is 20"):
        plan_delete_records(
            [], partition=0, before_offset=21, log_start_offset=0, log_end_offset=20
        )
