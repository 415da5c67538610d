"""The row rules hold the same verdict on the same rows in Spark and in Arrow."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sinks.log.log_keys import LogKeys
from sinks.log.records import DECODE_ERROR
from sinks.produce.validity import (
    ROW_RULES,
    arrow_rejection_reasons,
    reason_text,
    rejection_reason,
    row_problems,
)

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("region", pa.string()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        (DECODE_ERROR, pa.string()),
    ]
)
# One row per rule, rows breaking several rules at once, and good rows.
ROWS = [
    ("a", "eu", b"v", 0, 1, None),
    ("b", "eu", b"v", 0, 2, "bad magic byte"),
    (None, "eu", b"v", 0, 3, None),
    ("c", None, b"v", 1, 4, None),
    ("d", "eu", b"v", None, 5, None),
    ("e", "eu", b"v", -2, 6, None),
    ("f", "eu", b"v", 1, None, None),
    ("g", "eu", b"x" * 11, 1, 7, None),
    (None, None, b"x" * 11, -1, None, "truncated"),
    ("h", "eu", None, 2, 8, None),
    ("i", "eu", b"x" * 10, 2, 9, None),
]
KEYS = ("key", "region")


@pytest.mark.parametrize("has_offsets", [True, False])
def test_spark_and_arrow_name_the_same_first_broken_rule(spark, has_offsets):
    table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in ROWS], SCHEMA)
    settings = {
        "keys": LogKeys(key_columns=KEYS),
        "has_offsets": has_offsets,
        "message_max_bytes": 10,
    }
    masks = row_problems(table, **settings)
    unordered = ("null_sequence_tombstones",)  # no sequence column: the rule does not apply
    expected = [r for r in ROW_RULES if (has_offsets or r != "null_offsets") and r not in unordered]
    assert list(masks) == expected
    arrow = []
    for i, row in enumerate(ROWS):
        broken = [rule for rule, mask in masks.items() if mask[i].as_py()]
        if not broken:
            arrow.append(None)
            continue
        text = reason_text(broken[0], keys=LogKeys(key_columns=KEYS), message_max_bytes=10)
        arrow.append(text + row[-1] if broken[0] == "undecodable" else text)

    df = spark.createDataFrame(table)
    reasons = df.select(rejection_reason(df, **settings).alias("r")).collect()
    assert [r.r for r in reasons] == arrow
    assert arrow_rejection_reasons(table, **settings).to_pylist() == arrow
    assert arrow.count(None) == (3 if has_offsets else 4)
