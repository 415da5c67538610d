"""Latest per key: Spark and Arrow pick the same winner on the same rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sinks.cleaner.rules import arrow_latest_offsets, spark_latest_offsets
from sinks.log.log_keys import LogKeys

RECORDS = pa.table(
    {
        "partition": pa.array([0, 0, 0, 0, 0, 0, 1, 1, 0], pa.int32()),
        "key": ["a", "a", "b", "b", "c", "c", "a", "a", "a"],
        "region": ["eu", "eu", "eu", "eu", "eu", "eu", "eu", "eu", "us"],
        "seq": pa.array([5, 3, 2, 2, None, 1, None, None, 7], pa.int64()),
        "offset": pa.array([1, 2, 3, 4, 5, 6, 7, 8, 9], pa.int64()),
    }
)
GROUP = ["partition", "key", "region"]


def by_group(sequence_column: str | None) -> LogKeys:
    return LogKeys(key_columns=tuple(GROUP), sequence_column=sequence_column)


def _winners(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in [*GROUP, "offset"]), strict=True))


@pytest.mark.parametrize(
    ("sequence_column", "expected"),
    [
        # No sequence: the highest offset per (partition, key columns).
        (None, [(0, "a", "eu", 2), (0, "a", "us", 9), (0, "b", "eu", 4), (0, "c", "eu", 6),
                (1, "a", "eu", 8)]),
        # The sequence decides; a tie goes to the higher offset; a null sequence ranks lowest.
        ("seq", [(0, "a", "eu", 1), (0, "a", "us", 9), (0, "b", "eu", 4), (0, "c", "eu", 6),
                 (1, "a", "eu", 8)]),
    ],
)  # fmt: skip
def test_spark_and_arrow_pick_the_same_latest_record(spark, sequence_column, expected):
    arrow = arrow_latest_offsets(RECORDS, by_group(sequence_column))
    assert _winners(arrow) == expected
    rows = spark_latest_offsets(spark.createDataFrame(RECORDS), by_group(sequence_column)).collect()
    assert sorted(tuple(r) for r in rows) == expected


def test_a_nan_sequence_is_the_highest_in_both_engines(spark):
    records = pa.table(
        {
            "partition": pa.array([0, 0, 0, 0, 0], pa.int32()),
            "key": ["x", "x", "x", "y", "y"],
            "region": ["eu"] * 5,
            "seq": pa.array([1.0, float("nan"), 2.0, None, -1.0], pa.float64()),
            "offset": pa.array([10, 11, 12, 13, 14], pa.int64()),
        }
    )
    expected = [(0, "x", "eu", 11), (0, "y", "eu", 14)]
    assert _winners(arrow_latest_offsets(records, by_group("seq"))) == expected
    rows = spark_latest_offsets(spark.createDataFrame(records), by_group("seq")).collect()
    assert sorted(tuple(r) for r in rows) == expected
