"""A tombstone whose sequence is null is refused by name (design.md §49).

A null sequence sorts lowest (design.md §13): such a tombstone could never delete its key,
and Kafka's tombstone after a change stream's delete event (null value, so no sequence) is
the usual way to meet one. The batch fails, or the rows go to the dead-letter table with
the reason; a null sequence on a value is kept, ranked lowest, as before.
"""

from __future__ import annotations

import pytest
from testkit import state_of

from sinks import BadInputError, CompactedStateSink
from sinks.log.location import LogLocation
from sinks.produce.dead_letter import DeadLetterTable

SCHEMA = "key string, value string, seq long"


def test_a_tombstone_without_a_sequence_fails_the_batch_by_name(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), sequence_column="seq", clock=clock)
    sink(spark.createDataFrame([("a", "1", 5), ("b", "1", 5)], SCHEMA), 0)
    batch = spark.createDataFrame([("a", None, None), ("b", None, 6), ("c", "x", None)], SCHEMA)
    with pytest.raises(BadInputError) as caught:
        sink(batch, 1)
    assert "1 of 3 rows are tombstones whose sequence column 'seq' is null" in str(caught.value)
    assert "nothing was written" in str(caught.value)
    assert state_of(sink) == {"a": "1", "b": "1"}


def test_with_a_dead_letter_table_such_tombstones_are_quarantined(spark, lake, clock):
    dead = str(lake / "dead")
    sink = CompactedStateSink(
        str(lake / "log"), sequence_column="seq", clock=clock, dead_letter_table=dead
    )
    sink(spark.createDataFrame([("a", "1", 5), ("b", "1", 5)], SCHEMA), 0)
    sink(spark.createDataFrame([("a", None, None), ("b", None, 6), ("c", "x", None)], SCHEMA), 1)
    assert state_of(sink) == {"a": "1", "c": "x"}
    letters = DeadLetterTable(LogLocation(dead)).read().to_pylist()
    assert [r["reason"] for r in letters] == [
        "tombstone with a null sequence ('seq'): it could never win"
    ]
