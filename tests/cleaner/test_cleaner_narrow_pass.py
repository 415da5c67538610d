"""The pass with a sequence column: the map over (keys, sequence, offset), built in the tasks.

Each pass here is checked against the reference rule (`sinks.cleaner.rules`): the
latest record per key by a whole-row ``max_by``, then KIP-534's tombstone rules.
"""

from __future__ import annotations

import shutil

import pytest
from chispa import assert_df_equality

from sinks import CleanerConfig, CompactedStateSink
from sinks.cleaner.rules import (
    drop_expired_tombstones,
    latest_records,
    retain_latest,
    stamp_delete_horizon,
)
from sinks.log.log_keys import LogKeys
from sinks.log.records import PARTITION, VALUE

RETENTION = 1_000
SCHEMA = "k1 string, k2 int, value string, seq long, partition int"
KEYS = ("k1", "k2")


# -- the pass against the reference rule ---------------------------------------------------


def reference(df, *, pass_start_ms, sequence_column="seq"):
    """The rule the narrow pass replaced: whole-row max_by per key, then KIP-534."""
    latest = latest_records(
        df, LogKeys(key_columns=(PARTITION, *KEYS), sequence_column=sequence_column)
    )
    kept = drop_expired_tombstones(latest, pass_start_ms=pass_start_ms)
    return stamp_delete_horizon(
        kept, pass_start_ms=pass_start_ms, delete_retention_ms=RETENTION
    ).select(*df.columns)


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_log(path: str, clock: Clock) -> CompactedStateSink:
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=RETENTION)
    return CompactedStateSink(
        path, key_columns=KEYS, sequence_column="seq", config=config, clock=clock
    )


@pytest.fixture(scope="module")
def template(classic_spark, tmp_path_factory):
    """Three partitions, composite keys, out-of-order sequences, stamped tombstones.

    Built once; each test cleans its own copy. Returns (lake directory, clock time).
    """
    spark = classic_spark
    lake = tmp_path_factory.mktemp("narrow-pass")
    clock = Clock(1_700_000_000_000)
    sink = open_log(str(lake / "log"), clock)

    def append(rows, batch_id):
        sink(spark.createDataFrame(rows, SCHEMA).coalesce(1), batch_id)

    append([(f"k{i % 7}", i % 3, f"v{i}", i % 5, i % 3) for i in range(60)], 0)
    append(
        [
            ("k1", 1, None, 9, 1),  # tombstone, newest by sequence: it wins
            ("k2", 2, None, 0, 2),  # tombstone, older by sequence: the value wins
            ("k3", 0, None, 4, 0),  # tombstone, tie on sequence: the later offset wins
            ("k4", 1, "late", 1, 1),  # arrives later with a lower sequence: loses
            ("k5", 2, None, 7, 2),
        ],
        1,
    )
    sink.clean(force=True)  # stamps the tombstones with clock.now + RETENTION
    append(
        [
            ("k5", 2, "back", 8, 2),  # supersedes a stamped tombstone
            ("k6", 0, None, 9, 0),  # a new tombstone: stamped by the next pass
            ("k0", 0, "x", 9, 0),
            ("k0", 0, "y", 9, 0),  # same sequence, later offset: wins
        ],
        2,
    )
    append([(f"k{i % 4}", i % 2, f"w{i}", 3, i % 3) for i in range(20)], 3)
    sink.delete_records(1, 12)  # a log start offset inside partition 1
    # The stamped horizons lie in the past for the pass under test (an append now
    # would clean them away at once: an expired tombstone makes a partition cleanable).
    return lake, clock.now + 2 * RETENTION


@pytest.fixture
def log_copy(template, tmp_path):
    """A fresh copy of the template log, and the clock it was left at."""
    lake, now = template
    shutil.copytree(lake, tmp_path / "lake")
    clock = Clock(now)
    return open_log(str(tmp_path / "lake" / "log"), clock), clock


@pytest.mark.parametrize("segment_bytes", [10**9, 1], ids=["one-group", "group-per-file"])
def test_pass_equals_the_reference_rule(spark, log_copy, segment_bytes):
    sink, clock = log_copy
    sink.cleaner.segment_bytes = segment_bytes  # a partition's groups then split over tasks
    before = sink.log()
    expected = spark.createDataFrame(
        reference(before, pass_start_ms=clock.now).collect(), before.schema
    )
    assert expected.filter(
        f"{VALUE} is null and delete_horizon_ms = {clock.now + RETENTION}"
    ).count()
    expired = f"{VALUE} is null and delete_horizon_ms < {clock.now}"
    assert before.filter(expired).count() >= 1 and expected.filter(expired).count() == 0
    log_ends = sink.log_table.snapshot().log_end_offsets()

    stats = sink.clean(force=True)

    assert stats.end_offsets == log_ends
    assert_df_equality(sink.log(), expected, ignore_row_order=True, ignore_nullable=True)
    assert stats.records_written == expected.count()
    for p, segments in sink.log_table.snapshot().segments.items():
        for a, b in zip(segments, segments[1:], strict=False):
            assert a.last_offset < b.base_offset, f"partition {p}: files overlap"


def test_retain_latest_keeps_its_meaning(spark, log_copy):
    sink, clock = log_copy
    log = sink.log()
    kept = retain_latest(
        log,
        keys=LogKeys(key_columns=KEYS, sequence_column="seq"),
        pass_start_ms=clock.now,
        delete_retention_ms=RETENTION,
    )
    assert_df_equality(
        kept, reference(log, pass_start_ms=clock.now), ignore_row_order=True, ignore_nullable=True
    )


def test_pass_without_sequence_column_equals_the_reference_rule(spark, lake, clock):
    schema = "key string, value string, partition int"
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, delete_retention_ms=RETENTION)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    for b in range(4):
        rows = [
            (f"k{(i * (b + 1)) % 11}", None if i % 9 == 0 else f"v{b}-{i}", i % 2)
            for i in range(30)
        ]
        sink(spark.createDataFrame(rows, schema).coalesce(1), b)
    before = sink.log()
    latest = latest_records(before, LogKeys(key_columns=(PARTITION, "key")))
    expected = stamp_delete_horizon(
        drop_expired_tombstones(latest, pass_start_ms=clock.now),
        pass_start_ms=clock.now,
        delete_retention_ms=RETENTION,
    ).select(*before.columns)
    expected = spark.createDataFrame(expected.collect(), before.schema)
    sink.clean(force=True)
    assert_df_equality(sink.log(), expected, ignore_row_order=True, ignore_nullable=True)
