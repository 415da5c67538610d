"""`why_not_cleanable`: design.md §4's missing trigger, in numbers (pure, no Spark)."""

from __future__ import annotations

from sinks import CleanerConfig
from sinks.cleaner.log_to_clean import LogToClean, nothing_cleanable_line, why_not_cleanable

NOW = 1_700_000_000_000


def log(partition=0, *, first_dirty=0, first_uncleanable=10, clean=100, cleanable=50, **kw):
    return LogToClean(
        log_path="lake/users",
        partition=partition,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=first_uncleanable,
        clean_bytes=clean,
        cleanable_bytes=cleanable,
        **kw,
    )


def test_ratio_below_the_threshold_and_the_lag():
    config = CleanerConfig(min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=3_600_000)
    reason = why_not_cleanable(log(oldest_dirty_timestamp_ms=NOW - 60_000), config, now_ms=NOW)
    assert reason == (
        "p0: dirty ratio 0.33 not above min.cleanable.dirty.ratio 0.9, "
        "oldest dirty record 1.0 min old, not past max.compaction.lag.ms 1.0 h"
    )


def test_nothing_dirty_young_records_and_tombstones_not_due():
    config = CleanerConfig(min_compaction_lag_ms=60_000)
    young = log(first_dirty=10, cleanable=0)
    assert why_not_cleanable(young, config, now_ms=NOW).startswith(
        "p0: no cleanable bytes (dirty records are younger than min.compaction.lag.ms 1.0 min)"
    )
    idle = log(1, first_dirty=10, cleanable=0, earliest_delete_horizon_ms=NOW + 7_200_000)
    assert why_not_cleanable(idle, CleanerConfig(), now_ms=NOW) == (
        "p1: no dirty records, next tombstone due in 2.0 h"
    )


def test_one_line_per_log():
    line = nothing_cleanable_line("lake/users", [log(), log(1)], CleanerConfig(), now_ms=NOW)
    assert (
        line.startswith("lake/users: nothing to clean: p0: dirty ratio 0.33") and "; p1: " in line
    )
    policy = CleanerConfig(cleanup_policy="delete")
    assert "cleanup.policy=delete" in nothing_cleanable_line("x", [], policy, now_ms=NOW)
