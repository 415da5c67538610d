"""Every key type Spark groups on, and a sequence column, through the one pass.

Each log is cleaned twice (the second pass probes the clean section by key) and
held to a pure-Python reference: keys compared as Spark compares them (one NaN,
``-0.0`` equal to ``0.0``, structs field by field, a null field equal to a null
field), the newest record per key by (sequence, offset) with a null sequence the
lowest and NaN the highest.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pytest

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.records import DELETE_HORIZON_MS, OFFSET, PARTITION, VALUE

UTC = dt.UTC
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def spark_key(value):
    """A key as Spark groups it (`sinks.cleaner.offset_map.canonical_keys`, in Python)."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    if hasattr(value, "asDict"):
        return tuple(spark_key(v) for v in value)
    if isinstance(value, list | tuple):
        return tuple(spark_key(v) for v in value)
    return value


def spark_order(sequence):
    """(sequence) as Spark's struct order sorts it: null lowest, NaN highest."""
    if sequence is None:
        return (0, 0.0)
    if isinstance(sequence, float) and math.isnan(sequence):
        return (2, 0.0)
    return (1, sequence)


def expected_offsets(rows, key_columns, sequence_column):
    newest = {}
    for row in rows:
        key = (row[PARTITION], *[spark_key(row[k]) for k in key_columns])
        order = (spark_order(row[sequence_column]) if sequence_column else (), row[OFFSET])
        if key not in newest or order > newest[key][0]:
            newest[key] = (order, (row[PARTITION], row[OFFSET]))
    return sorted(v[1] for v in newest.values())


CASES = {
    "double": (
        "k double, value string, partition int",
        ("k",),
        None,
        [
            [(0.0, "a", 0), (-0.0, "b", 0), (math.nan, "c", 0), (1.5, "d", 1), (math.nan, None, 0)],
            [(-0.0, "e", 0), (1.5, None, 1), (2.5, "f", 1), (math.nan, "g", 0)],
        ],
    ),
    "composite-with-sequence": (
        "ts timestamp, d decimal(10,2), s struct<a:int,b:double>, seq double, "
        "value string, partition int",
        ("ts", "d", "s"),
        "seq",
        [
            [
                (T0, Decimal("1.10"), (1, 0.0), 5.0, "a", 0),
                (T0, Decimal("1.10"), (1, -0.0), 4.0, "b", 0),  # same key, lower: loses
                (T0, Decimal("1.1"), (None, 1.0), None, "c", 1),
                (T0, Decimal("1.10"), (None, 1.0), 1.0, "d", 1),  # same key, null seq loses
                (T0 + dt.timedelta(microseconds=1), Decimal("2.00"), (3, None), 1.0, "e", 0),
            ],
            [
                (T0, Decimal("1.10"), (1, 0.0), math.nan, None, 0),  # NaN: highest
                (T0 + dt.timedelta(microseconds=1), Decimal("2.00"), (3, None), 0.5, "f", 0),
                (T0, Decimal("3.00"), (2, math.nan), 1.0, "g", 1),
                (T0, Decimal("3.00"), (2, math.nan), 1.0, "h", 1),  # tie: later offset
            ],
        ],
    ),
}


@pytest.mark.parametrize(
    "buffer", [CleanerConfig().dedupe_buffer_size, 700], ids=["map-at-once", "map-in-buckets"]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_key_type_takes_the_one_pass(spark, lake, clock, case, buffer):
    """700 bytes map two records at once (`size_map`): more are mapped in key buckets."""
    schema, keys, sequence, batches = CASES[case]
    sink = CompactedStateSink(
        str(lake / f"{case}-{buffer}"),
        key_columns=keys,
        sequence_column=sequence,
        config=CleanerConfig(
            min_cleanable_dirty_ratio=1.0, delete_retention_ms=10**9, dedupe_buffer_size=buffer
        ),
        clock=clock,
        cleaning="inline",
    )
    for batch_id, rows in enumerate(batches):
        sink(spark.createDataFrame(rows, schema).coalesce(1), batch_id)
        before = sink.log().collect()
        state = sorted(map(repr, sink.state().collect()))
        stats = sink.clean(force=True)
        assert stats is not None and not stats.work_left
        after = sink.log().collect()
        assert sorted((r[PARTITION], r[OFFSET]) for r in after) == expected_offsets(
            before, keys, sequence
        )
        assert all(r[DELETE_HORIZON_MS] is not None for r in after if r[VALUE] is None)
        assert sorted(map(repr, sink.state().collect())) == state
