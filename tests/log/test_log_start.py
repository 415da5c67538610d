"""The log start offset's rule: Spark and Arrow hide the same records below it."""

from __future__ import annotations

import pyarrow as pa
from testkit import segment

from sinks.log.records import at_or_above, spark_at_or_above
from sinks.log.segment import split_clean

RECORDS = pa.table(
    {
        "partition": pa.array([0, 0, 0, 1, 1, 2, 2], pa.int32()),
        "offset": pa.array([0, 4, 5, 0, 9, 3, 7], pa.int64()),
    }
)
FLOORS = {0: 5, 1: 0, 3: 2}  # partition 1 starts at 0; partition 2 has none: 0 too


def test_spark_and_arrow_keep_the_same_records_at_or_above_the_log_start(spark):
    expected = [(0, 5), (1, 0), (1, 9), (2, 3), (2, 7)]
    arrow = at_or_above(RECORDS, FLOORS)
    assert list(zip(*arrow.to_pydict().values(), strict=True)) == expected
    rows = spark_at_or_above(spark.createDataFrame(RECORDS), FLOORS).collect()
    assert sorted(tuple(r) for r in rows) == expected


def test_a_segment_is_clean_only_when_wholly_below_the_end():
    segments = [segment(0, b, b + 9) for b in (0, 10, 20)]
    assert split_clean(segments, 20) == (segments[:2], segments[2:])
    assert split_clean(segments, 15) == (segments[:1], segments[1:])  # straddling: dirty
    assert split_clean(segments, None) == ([], segments)
    assert split_clean(reversed(segments), 10) == (segments[:1], segments[1:])
