"""`sinks.read_state` (no Spark, no JVM) against `CompactedStateSink.state` on every kind of log.

Each test builds a log through the sink (real Spark, real Delta), then asks both
readers: the rows must be the same (compared sorted), as must the columns `read_state`
promises (key columns, value, payload). Logs: never cleaned, cleaned with a
dirty tail, a partial pass, several partitions, composite keys with payload and
struct values, a sequence column across the clean/dirty split, ``delete_records``
and time travel; the streaming variant gives the same rows in bounded batches.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks import (
    CleanerConfig,
    CompactedSinkError,
    CompactedStateSink,
    TimeTravelError,
    read_state,
    read_state_batches,
)

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
KV = "key string, value string"
KVP = "key string, value string, partition int"


def batch(spark, rows, schema=KV):
    return spark.createDataFrame(rows, schema).coalesce(1)


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, default=str)


def assert_matches_state(sink, as_of=None) -> pa.Table:
    """read_state(path) has state()'s rows (on state()'s columns); returns the Arrow table."""
    table = read_state(sink.path, as_of=as_of)
    columns = [*sink.key_columns, "value"]
    got = sorted(_canonical({c: r[c] for c in columns}) for r in table.to_pylist())
    want = sorted(_canonical(r.asDict(recursive=True)) for r in sink.state(as_of).collect())
    assert got == want
    assert table.schema.names[: len(columns)] == columns
    return table


def as_dict(table: pa.Table) -> dict:
    return {r["key"]: r["value"] for r in table.to_pylist()}


# -- pure ----------------------------------------------------------------------------------


# -- against state() -----------------------------------------------------------------------


def test_never_cleaned_log(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1")]), 0)
    sink(batch(spark, [("a", "a2"), ("b", None), ("a", "a3")]), 1)
    table = assert_matches_state(sink)
    assert as_dict(table) == {"a": "a3", "c": "c1"}
    assert table.schema.names == ["key", "value"]  # metadata and delete_horizon_ms stay out


def test_cleaned_log_with_a_dirty_tail_and_tombstones_in_both_sections(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1"), ("e", "e1")]), 0)
    sink(batch(spark, [("a", "a2"), ("c", None), ("e", None)]), 1)
    sink.clean(force=True)
    sink(batch(spark, [("a", None), ("b", "b2"), ("e", "e2"), ("f", "f1"), ("b", "b3")]), 2)
    sink(batch(spark, [("f", None), ("g", "g1")]), 3)
    assert as_dict(assert_matches_state(sink)) == {"b": "b3", "d": "d1", "e": "e2", "g": "g1"}
    sink.clean(force=True)  # cleaning never changes the state
    assert as_dict(assert_matches_state(sink)) == {"b": "b3", "d": "d1", "e": "e2", "g": "g1"}


def test_partial_pass_leaves_an_uncleanable_section(spark, lake, clock):
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, min_compaction_lag_ms=60_000)
    sink = CompactedStateSink(str(lake / "log"), config=config, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1")]), 0)
    sink(batch(spark, [("a", "a2"), ("c", None)]), 1)
    clock.advance(120_000)
    sink(batch(spark, [("a", "a3"), ("b", None)]), 2)
    sink(batch(spark, [("c", "c2"), ("d", "d1")]), 3)
    sink.clean(force=True)  # only the first two batches are old enough
    assert as_dict(assert_matches_state(sink)) == {"a": "a3", "c": "c2", "d": "d1"}


def test_several_partitions_one_never_cleaned(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    rows = [(f"k{i}", f"v{i}", i % 3) for i in range(9)]
    sink(batch(spark, rows, KVP), 0)
    sink(batch(spark, [("k0", "w0", 0), ("k1", None, 1), ("k2", "w2", 2)], KVP), 1)
    sink.clean(force=True)
    sink(batch(spark, [("k3", None, 0), ("k4", "x4", 1), ("k0", "x0", 0), ("k5", "x5", 2)], KVP), 2)
    sink(batch(spark, [("k9", "y9", 3)], KVP), 3)  # partition 3: never cleaned
    got = as_dict(assert_matches_state(sink))
    assert got["k0"] == "x0" and "k1" not in got and "k3" not in got and got["k9"] == "y9"


def test_composite_keys_payload_columns_and_struct_values(spark, lake, clock):
    schema = "tenant string, id int, value struct<name: string, n: long>, topic string"
    sink = CompactedStateSink(
        str(lake / "log"), key_columns=("tenant", "id"), config=NO_CLEAN, clock=clock
    )
    sink(
        batch(
            spark,
            [("t1", 1, ("a", 1), "x"), ("t1", 2, ("b", 2), "x"), ("t2", 1, ("c", 3), "y")],
            schema,
        ),
        0,
    )
    sink.clean(force=True)
    sink(batch(spark, [("t1", 1, ("a2", 4), "z"), ("t2", 1, None, "z")], schema), 1)
    table = assert_matches_state(sink)
    assert table.schema.names == ["tenant", "id", "value", "topic"]
    rows = {(r["tenant"], r["id"]): (r["value"], r["topic"]) for r in table.to_pylist()}
    assert rows == {
        ("t1", 1): ({"name": "a2", "n": 4}, "z"),
        ("t1", 2): ({"name": "b", "n": 2}, "x"),
    }


def test_sequence_column_across_the_clean_dirty_split(spark, lake, clock):
    schema = "key string, value string, seq long"
    sink = CompactedStateSink(
        str(lake / "log"), sequence_column="seq", config=NO_CLEAN, clock=clock
    )
    sink(
        batch(spark, [("a", "a10", 10), ("b", "b5", 5), ("c", None, 7), ("d", "d5", 5)], schema), 0
    )
    sink.clean(force=True)
    tail = [("a", "a3", 3), ("b", "b12", 12), ("c", "c2", 2), ("d", None, 5), ("e", "e1", 1)]
    sink(batch(spark, tail, schema), 1)
    table = assert_matches_state(sink)
    assert as_dict(table) == {"a": "a10", "b": "b12", "e": "e1"}
    assert table.schema.names == ["key", "value", "seq"]  # the sequence column is payload
    reader = CompactedStateSink(str(lake / "log"))  # the log's sequence column is recorded
    assert reader.sequence_column == "seq"


def test_delete_records_hides_what_lies_below_the_log_start(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1")]), 0)
    sink(batch(spark, [("b", "b2"), ("e", "e1")]), 1)
    sink.clean(force=True)  # clean: c1 d1 b2 e1 at offsets 2..5
    sink(batch(spark, [("c", None), ("f", "f1"), ("a", "a2")]), 2)  # offsets 6..8
    sink.delete_records(0, 3)  # inside the clean file: c1 goes
    assert_matches_state(sink)
    sink.delete_records(0, 7)  # inside the dirty file: the tombstone of c goes, f stays
    assert as_dict(assert_matches_state(sink)) == {"f": "f1", "a": "a2"}


def test_as_of_versions_and_timestamps(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1"), ("b", "b1")]), 0)
    sink(batch(spark, [("a", "a2"), ("c", "c1")]), 1)
    before_pass = sink.log_table.snapshot().version
    sink.clean(force=True)
    sink(batch(spark, [("a", None), ("b", "b2")]), 2)
    for version in (0, before_pass, None):
        assert_matches_state(sink, as_of=version)
    assert as_dict(read_state(sink.path, as_of=before_pass)) == {"a": "a2", "b": "b1", "c": "c1"}
    latest = as_dict(read_state(sink.path, as_of="2100-01-01T00:00:00Z"))  # after every commit
    assert latest == as_dict(read_state(sink.path)) == {"b": "b2", "c": "c1"}
    # Delta's history says WRITE for every commit; the sink's entry names the pass.
    history = DeltaTable(sink.path).history()
    operations = [_entry(c.get("compactedSink")).get("operation") for c in history]
    assert operations.count("clean") == 1 and operations.count("append") == 3


def _entry(value) -> dict:
    return json.loads(value) if isinstance(value, str) else value or {}


def test_time_travel_outside_the_log_names_the_range_it_reaches(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", "a1")]), 0)
    sink(batch(spark, [("a", "a2")]), 1)
    newest = sink.log_table.snapshot().version
    reach = rf"time travel reaches versions 0 to {newest} \(committed 20"
    for as_of in (999, "2001-09-09T01:46:40Z"):  # past the newest; before the table existed
        with pytest.raises(TimeTravelError, match=reach):
            sink.state(as_of=as_of)
        with pytest.raises(TimeTravelError, match=reach):
            read_state(sink.path, as_of=as_of)
    with pytest.raises(CompactedSinkError, match="past the log's newest version"):
        read_state(sink.path, as_of=999)
    with pytest.raises(CompactedSinkError, match="before the log's first version"):
        read_state(sink.path, as_of="2001-09-09T01:46:40Z")


def test_empty_and_missing_logs(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [("a", None)]), 0)
    assert assert_matches_state(sink).num_rows == 0
    with pytest.raises(FileNotFoundError, match="no compacted log"):
        read_state(str(lake / "nothing-here"))


def test_batches_stream_the_same_rows_in_bounded_batches(spark, lake, clock):
    sink = CompactedStateSink(str(lake / "log"), config=NO_CLEAN, clock=clock)
    sink(batch(spark, [(f"k{i}", f"v{i}", i % 2) for i in range(50)], KVP), 0)
    sink.clean(force=True)
    sink(batch(spark, [(f"k{i}", f"w{i}", i % 2) for i in range(0, 50, 3)], KVP), 1)
    reader = read_state_batches(sink.path, batch_rows=7)
    assert isinstance(reader, pa.RecordBatchReader)
    batches = list(reader)
    assert batches and all(b.num_rows <= 7 for b in batches)
    streamed = pa.Table.from_batches(batches, schema=reader.schema)
    assert sorted(streamed.to_pylist(), key=str) == sorted(
        assert_matches_state(sink).to_pylist(), key=str
    )
