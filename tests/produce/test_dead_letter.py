"""design.md §12: bad input fails a whole batch, or goes to the dead-letter table with a reason."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from testkit import state_of

from sinks import BadInputError, CleanerConfig, CompactedStateSink, SchemaMismatchError
from sinks.log.location import LogLocation
from sinks.produce.dead_letter import DECODE_ERROR, DeadLetterTable

CONFIG = CleanerConfig(min_cleanable_dirty_ratio=1.0, message_max_bytes=16)
SCHEMA = "key string, value string, _decode_error string"
ROWS = [
    ("a", "1", None),
    (None, "no key", None),
    ("b", "x" * 17, None),  # over message.max.bytes
    ("c", None, "bad magic byte 0x07"),  # a decoder could not read the payload
    ("d", "2", None),
    (None, None, None),
]


def test_without_dead_letter_table_bad_rows_fail_the_batch_and_nothing_is_written(
    spark, lake, clock
):
    sink = CompactedStateSink(str(lake / "log"), config=CONFIG, clock=clock)
    sink(spark.createDataFrame([("a", "0")], "key string, value string"), 0)
    version = sink.log_table.snapshot().version
    batch = spark.createDataFrame(ROWS, SCHEMA)
    with pytest.raises(BadInputError) as error:
        sink(batch, 1)
    message = str(error.value)
    assert "2 of 6 rows have a null key" in message
    assert "1 of 6 rows have a value larger than message.max.bytes (16 bytes)" in message
    assert "1 of 6 rows have an undecodable payload" in message
    assert sink.log_table.snapshot().version == version
    with pytest.raises(SchemaMismatchError, match="'value' has type int"):
        sink(spark.createDataFrame([("a", 1)], "key string, value int"), 2)
    assert sink.log_table.snapshot().version == version
    assert state_of(sink) == {"a": "0"}


@pytest.mark.both_sessions
def test_with_dead_letter_table_bad_rows_are_quarantined_once_good_rows_written(spark, lake, clock):
    dead = str(lake / "dead")
    sink = CompactedStateSink(str(lake / "log"), config=CONFIG, clock=clock, dead_letter_table=dead)
    batch = spark.createDataFrame(ROWS, SCHEMA)
    sink(batch, 0)
    sink(batch, 0)  # a replayed batch: neither table is written twice

    assert state_of(sink) == {"a": "1", "d": "2"}
    assert DECODE_ERROR not in sink.log().columns
    letters = sorted(
        DeadLetterTable(LogLocation(dead)).read().to_pylist(), key=lambda r: r["reason"]
    )
    assert [r["reason"] for r in letters] == [
        "null key (key)",
        "null key (key)",
        "undecodable payload: bad magic byte 0x07",
        "value larger than message.max.bytes (16 bytes)",
    ]
    assert {(r["batch_id"], r["dead_lettered_ms"], r["log_path"]) for r in letters} == {
        (0, clock(), sink.path)
    }
    assert '"key":"b"' in letters[3]["record"]
    assert '"_decode_error":"bad magic byte 0x07"' in letters[2]["record"]


def test_with_dead_letter_table_a_refused_schema_change_still_fails_the_batch(spark, lake, clock):
    """A schema change is not a bad row: nothing is diverted, nothing is written, the batch
    fails and is not counted as done (issue 22: every new-schema batch used to go there)."""
    dead = str(lake / "dead")
    sink = CompactedStateSink(str(lake / "log"), config=CONFIG, clock=clock, dead_letter_table=dead)
    sink(spark.createDataFrame([("a", "0")], "key string, value string"), 0)
    version = sink.log_table.snapshot().version
    with pytest.raises(SchemaMismatchError, match="'value' has type int in the batch"):
        sink(spark.createDataFrame([("a", 1), ("b", 2)], "key string, value int"), 1)
    binary = spark.createDataFrame([("k", "v")], "key string, value string").select(
        "key", F.col("value").cast("binary").alias("value")
    )
    with pytest.raises(SchemaMismatchError, match="'value' has type binary in the batch"):
        sink(binary, 1)
    assert sink.log_table.snapshot().version == version
    assert sink.log_table.snapshot().txn_version(sink.sink_id) == 0  # batch 1 is not done
    assert DeadLetterTable(LogLocation(dead)).read().num_rows == 0
    assert state_of(sink) == {"a": "0"}
