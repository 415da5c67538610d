"""Each rule once, in both engines: the Spark and the Arrow version agree on the same rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from sinks.cleaner.offset_map import canonical_keys, key_buckets
from sinks.cleaner.rules import (
    apply_arrow_tombstone_rules,
    apply_tombstone_rules,
    latest_records,
)
from sinks.log.latest import latest_offsets
from sinks.log.log_keys import LogKeys

SCHEMA = (
    "k double, s struct<a:int>, seq double, value string, partition int, offset long, "
    "delete_horizon_ms long"
)
ROWS = [
    (0.0, (1,), 1.0, "a", 0, 0, None),
    (-0.0, (1,), 1.0, "b", 0, 1, None),  # same key as offset 0 (-0.0 == 0.0), tie: later wins
    (math.nan, None, None, None, 0, 2, 50),  # an expired tombstone
    (math.nan, None, 2.0, "c", 0, 3, None),  # same key (one NaN), higher sequence
    (1.0, (None,), math.nan, None, 0, 4, None),  # NaN sequence: the highest
    (1.0, (None,), 9.0, "d", 0, 5, None),
    (1.0, None, 3.0, None, 0, 6, 500),  # a null struct is not a struct of nulls
]


def test_spark_and_arrow_keep_the_same_latest_records(spark):
    df = spark.createDataFrame(ROWS, SCHEMA)
    spark_latest = sorted(
        r.offset
        for r in latest_records(
            df, LogKeys(key_columns=("k", "s"), sequence_column="seq")
        ).collect()
    )
    table = pa.Table.from_pylist([r.asDict(recursive=True) for r in df.collect()])
    keys = canonical_keys(table, ["k", "s"])
    _, arrow_latest = latest_offsets(keys, table.column("offset"), table.column("seq"))
    assert sorted(arrow_latest.tolist()) == spark_latest == [1, 3, 4, 6]
    _, by_offset = latest_offsets(keys, table.column("offset"))
    assert sorted(by_offset.tolist()) == [1, 3, 5, 6]


def test_spark_and_arrow_apply_the_same_tombstone_rules(spark):
    df = spark.createDataFrame(ROWS, SCHEMA)
    rules = {"pass_start_ms": 100, "delete_retention_ms": 10}
    spark_kept = sorted(
        (r.offset, r.delete_horizon_ms) for r in apply_tombstone_rules(df, **rules).collect()
    )
    table = pa.Table.from_pylist([r.asDict(recursive=True) for r in df.collect()])
    arrow = apply_arrow_tombstone_rules(table, **rules)
    arrow_kept = sorted(
        zip(arrow["offset"].to_pylist(), arrow["delete_horizon_ms"].to_pylist(), strict=True)
    )
    assert arrow_kept == spark_kept
    assert (2, 50) not in arrow_kept and (4, 110) in arrow_kept and (6, 500) in arrow_kept


def test_keys_spark_groups_together_share_a_bucket_however_the_rows_are_chunked():
    table = pa.Table.from_pylist(
        [
            {"k": k, "s": s, "name": name}
            for k, s, name in [
                (0.0, {"a": 1}, "x"),
                (-0.0, {"a": 1}, "x"),  # the same key as the row before
                (math.nan, None, ""),
                (float("nan"), None, ""),  # one NaN: the same key again
                (1.0, {"a": None}, None),
                (1.0, {"a": None}, None),
                *[(float(i), {"a": i}, f"key-{i}") for i in range(2_000)],
            ]
        ]
    )
    columns = ["k", "s", "name"]
    whole = key_buckets(canonical_keys(table, columns, every_validity=True), 4)
    assert whole[0] == whole[1] and whole[2] == whole[3] and whole[4] == whole[5]
    # another chunking (other nulls per chunk) encodes alike and buckets alike
    parts = [table.slice(0, 3), table.slice(3, 1), table.slice(4)]
    encoded = [canonical_keys(t, columns, every_validity=True) for t in parts]
    assert len({tuple(e.schema.types) for e in encoded}) == 1
    assert np.concatenate([key_buckets(e, 4) for e in encoded]).tolist() == whole.tolist()
    assert min(np.bincount(whole, minlength=4)) > 400  # spread, not lumped
    assert not key_buckets(canonical_keys(table, columns), 1).any()
