"""The pure planning a pass starts from, without Spark: which partitions a round cleans
(`filthiest_cleanable`) and each partition's share (`plan_partition`), as Kafka's
LogCleanerManagerTest and LogCleanerTest check ``grabFilthiestCompactedLog`` and the
offset map's bound."""

from __future__ import annotations

from testkit import segment

from sinks import CleanerConfig
from sinks.cleaner.log_to_clean import LogToClean, filthiest_cleanable
from sinks.cleaner.offset_map import BYTES_PER_MAPPED_RECORD
from sinks.cleaner.pass_planning import plan_partition
from sinks.log.log_keys import LogKeys

NOW = 10_000_000
KEY = LogKeys(key_columns=("key",))


def candidate(partition, clean, cleanable, *, oldest=None, horizon=None, first_dirty=0, end=0):
    return LogToClean(
        log_path="lake/t",
        partition=partition,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=end,
        clean_bytes=clean,
        cleanable_bytes=cleanable,
        oldest_dirty_timestamp_ms=oldest,
        earliest_delete_horizon_ms=horizon,
    )


def test_the_round_takes_the_cleanable_partitions_dirtiest_first():
    config = CleanerConfig(min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=1_000)
    below_ratio = candidate(0, 60, 40)
    dirtiest = candidate(1, 10, 90)
    past_the_ratio = candidate(2, 40, 60)
    lagging = candidate(3, 90, 10, oldest=NOW - 5_000)  # below the ratio, past the max lag
    tombstones = candidate(4, 100, 0, horizon=NOW - 1)  # nothing dirty, a tombstone expired
    idle = candidate(5, 100, 0)
    logs = [below_ratio, dirtiest, past_the_ratio, lagging, tombstones, idle]

    chosen = filthiest_cleanable(logs, config, now_ms=NOW)
    assert [log.partition for log in chosen] == [1, 2, 3, 4]
    forced = filthiest_cleanable(logs, config, now_ms=NOW, force=True)
    assert [log.partition for log in forced] == [1, 2, 0, 3, 4]  # any cleanable bytes
    assert filthiest_cleanable([], config, now_ms=NOW) == []


def test_a_partitions_share_ends_at_its_first_uncleanable_offset():
    segments = [segment(0, 0, 9), segment(0, 10, 19), segment(0, 20, 29), segment(0, 30, 39)]
    log = candidate(0, 100, 300, first_dirty=10, end=30)
    plan = plan_partition(log, segments, cleaner_offset=10, keys=KEY, dedupe_buffer_size=1 << 30)
    assert plan.inputs == tuple(segments[:3])  # the segment at 30 is not read
    assert plan.mapped == tuple(segments[1:3])  # only the dirty section is mapped
    assert (plan.end_offset, plan.cut, plan.buckets) == (30, False, 1)


def test_a_partitions_share_is_cut_where_its_map_fills():
    segments = [segment(0, 0, 9), segment(0, 10, 19), segment(0, 20, 29)]
    log = candidate(0, 0, 300, end=30)
    plan = plan_partition(
        log, segments, cleaner_offset=None, keys=KEY, dedupe_buffer_size=BYTES_PER_MAPPED_RECORD
    )
    assert (plan.end_offset, plan.cut) == (10, True)
    assert plan.inputs == plan.mapped == (segments[0],)


def test_a_sequence_column_maps_the_clean_section_too():
    segments = [segment(0, 0, 9), segment(0, 10, 19)]
    log = candidate(0, 100, 100, first_dirty=10, end=20)
    keys = LogKeys(key_columns=("key",), sequence_column="seq")
    plan = plan_partition(log, segments, cleaner_offset=10, keys=keys, dedupe_buffer_size=1 << 30)
    assert plan.mapped == plan.inputs == tuple(segments) and not plan.cut
