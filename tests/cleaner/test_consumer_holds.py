"""Expired tombstones held for registered consumers, on the Arrow and the Spark path."""

from __future__ import annotations

import pyarrow as pa
from testkit import segment

from sinks.cleaner.log_to_clean import LogToClean
from sinks.cleaner.pass_planning import without_held_tombstones
from sinks.cleaner.rules import apply_arrow_tombstone_rules as apply_tombstone_rules
from sinks.cleaner.rules import drop_expired_tombstones

ROWS = {
    "key": ["a", "b", "c", "d"],
    "value": [None, None, "x", None],
    "partition": [0, 0, 0, 1],
    "offset": [1, 5, 6, 2],
    "delete_horizon_ms": [10, 10, None, 10],
}


def test_arrow_rules_keep_expired_tombstones_at_or_above_held_below() -> None:
    table = pa.table({k: v for k, v in ROWS.items()}).slice(0, 3)
    kept = apply_tombstone_rules(table, pass_start_ms=100, delete_retention_ms=50, held_below=5)
    assert kept.column("offset").to_pylist() == [5, 6]
    plain = apply_tombstone_rules(table, pass_start_ms=100, delete_retention_ms=50)
    assert plain.column("offset").to_pylist() == [6]


def test_spark_rules_keep_expired_tombstones_per_partition(spark) -> None:
    df = spark.createDataFrame(
        list(zip(*ROWS.values(), strict=True)),
        "key string, value string, partition int, offset long, delete_horizon_ms long",
    )
    kept = drop_expired_tombstones(df, pass_start_ms=100, held_below={0: 5})
    assert sorted(r.offset for r in kept.collect()) == [5, 6]  # partition 1 is not held
    assert sorted(r.offset for r in drop_expired_tombstones(df, pass_start_ms=100).collect()) == [6]


def test_a_held_tombstone_is_no_reason_to_clean() -> None:
    log = LogToClean(
        log_path="l",
        partition=0,
        first_dirty_offset=20,
        first_uncleanable_offset=20,
        clean_bytes=200,
        cleanable_bytes=0,
        earliest_delete_horizon_ms=10,
    )
    segments = [segment(0, 0, 9, horizon=None), segment(0, 10, 19, horizon=10)]
    assert not without_held_tombstones(log, segments, 10).has_expired_tombstones(100)
    assert without_held_tombstones(log, segments, 11).has_expired_tombstones(100)
    assert without_held_tombstones(log, segments, None) is log
