"""Checkpoint and consumer-offset rows describe one history of one table.

A row names the Delta table (its id) and the version it describes. A copy of the log
taken before its last pass and put back at its path, or a new table at an old path,
starts from what its own Delta log says; ``status`` says what it found. Checkpoint
tables written before rows named their table keep working.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import types as T

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint, other_history, split_histories
from checkpoints.checkpoint_table import CHECKPOINT_SCHEMA
from checkpoints.consumer_offsets import CONSUMER_OFFSETS_SCHEMA, ConsumerOffsets
from sinks import CleanerConfig, CompactedStateSink
from streaming.status.gauges import log_status
from streaming.status.status_render import render_table

SCHEMA = T.StructType(
    [T.StructField("key", T.StringType()), T.StructField("value", T.StringType())]
)
NO_INLINE_CLEANING = CleanerConfig(min_cleanable_dirty_ratio=1.0)


def test_a_row_names_its_table_and_version() -> None:
    assert other_history("t1", 5, table_id="t1", version=5) is None
    assert other_history(None, None, table_id="t1", version=0) is None  # an older row: unknown
    assert "another table" in other_history("t0", 2, table_id="t1", version=9)
    assert "older copy" in other_history("t1", 7, table_id="t1", version=3)

    rows = {
        0: CheckpointEntry(log_path="l", partition=0, first_dirty_offset=9, log_version=7),
        1: CheckpointEntry(log_path="l", partition=1, first_dirty_offset=4, log_version=2),
    }
    asked = []

    def latest() -> int:
        asked.append(1)
        return 7

    # A row of a version after the caller's snapshot is judged against the latest version:
    # a pass committed since is not another history.
    kept, others = split_histories(rows, table_id="t1", version=5, latest_version=latest)
    assert sorted(kept) == [0, 1] and not others and asked == [1]
    kept, others = split_histories(rows, table_id="t1", version=5, latest_version=lambda: 5)
    assert sorted(kept) == [1] and "version 7" in others[0]


def test_an_older_copy_put_back_is_cleaned_again(spark, lake, tmp_path) -> None:
    path = str(lake / "users")
    sink = CompactedStateSink(path, config=NO_INLINE_CLEANING)
    for batch in range(2):
        rows = [(f"k{i}", f"v{batch}-{i}") for i in range(100)]
        sink(spark.createDataFrame(rows, SCHEMA), batch)
    backup = tmp_path / "backup"
    shutil.copytree(path, backup)  # the copy, taken before the pass
    assert sink.clean(force=True) is not None
    assert sink.log().count() == 100
    (row,) = sink.checkpoints.read(sink.path).values()
    assert row.table_id == DeltaTable(path).metadata().id
    assert row.log_version == DeltaTable(path).version()

    shutil.rmtree(path)
    shutil.copytree(backup, path)  # a restore by copy
    restored = CompactedStateSink(path)
    status = log_status(restored)
    assert status.dirty_ratio == 1.0  # not the 0.00 the other history's row would say
    (p0,) = status.partitions
    assert p0.first_dirty_offset == 0 and p0.last_clean_ms is None
    (note,) = status.checkpoint_notes
    assert "an older copy of the log was put back" in note and "ignored" in note
    assert "ignored; the next pass starts" in render_table([status])

    eager = CompactedStateSink(path, config=CleanerConfig(min_cleanable_dirty_ratio=0.5))
    assert eager.clean() is not None  # the ordinary trigger: the ratio is above 0.5
    assert eager.log().count() == 100 and eager.state().count() == 100
    (row,) = eager.checkpoints.read(eager.path).values()
    assert (row.first_dirty_offset, row.table_id) == (200, DeltaTable(path).metadata().id)
    assert not log_status(eager).checkpoint_notes


def test_a_new_table_at_an_old_path_starts_from_its_own_log(spark, lake, caplog) -> None:
    path = str(lake / "users")
    first = CompactedStateSink(path, config=NO_INLINE_CLEANING)
    first(spark.createDataFrame([("a", "1"), ("a", "2")], SCHEMA), 0)
    first.clean(force=True)
    old_id = DeltaTable(path).metadata().id

    shutil.rmtree(path)  # dropped and created again
    second = CompactedStateSink(path, config=NO_INLINE_CLEANING)
    second(spark.createDataFrame([("b", "0")], SCHEMA), 0)
    new_id = DeltaTable(path).metadata().id
    assert new_id != old_id
    # Seen before any recovery (status reads only), then replaced by the sink's recovery.
    (row,) = second.checkpoints.read(second.path).values()
    second.checkpoints.write([row.with_changes(table_id=old_id, log_version=0)])
    (note,) = log_status(second).checkpoint_notes
    assert f"describes another table (Delta table id {old_id}" in note
    with caplog.at_level("WARNING", logger="compacted_sink"):
        for batch in range(1, 4):
            second(spark.createDataFrame([("b", str(batch))], SCHEMA), batch)
    assert any("another table" in r.getMessage() for r in caplog.records)
    (row,) = second.checkpoints.read(second.path).values()
    assert (row.table_id, row.first_dirty_offset) == (new_id, 0)
    stats = second.clean(force=True)
    assert stats is not None and second.log().count() == 1


def test_tables_written_before_rows_named_their_table_keep_working(tmp_path) -> None:
    uri = str(tmp_path / "_cleaner-offset-checkpoint")
    old_schema = pa.schema([f for f in CHECKPOINT_SCHEMA if f.name != "table_id"])
    old_row = {f.name: None for f in old_schema} | {
        "log_path": "lake/users",
        "partition": 0,
        "first_dirty_offset": 42,
        "cleaner_state": "idle",
        "failed_attempts": 0,
    }
    write_deltalake(uri, pa.Table.from_pylist([old_row], schema=old_schema))
    checkpoint = CleanerOffsetCheckpoint(uri)
    (entry,) = checkpoint.read().values()
    assert (entry.first_dirty_offset, entry.table_id) == (42, None)  # unknown: kept

    checkpoint.write([entry.with_changes(first_dirty_offset=50, table_id="t1", log_version=3)])
    assert "table_id" in DeltaTable(uri).schema().to_arrow().names  # evolved
    (entry,) = checkpoint.read().values()
    assert (entry.first_dirty_offset, entry.table_id, entry.log_version) == (50, "t1", 3)

    offsets_uri = str(tmp_path / "_consumer-offsets")
    old_offsets = pa.schema([f for f in CONSUMER_OFFSETS_SCHEMA if not f.name.startswith("table")])
    write_deltalake(
        offsets_uri,
        pa.Table.from_pylist(
            [
                {
                    "log_path": "lake/users",
                    "consumer_id": "billing",
                    "partition": 0,
                    "committed_offset": 7,
                    "committed_ms": 1_000,
                    "expiration_ms": 10**12,
                }
            ],
            schema=old_offsets,
        ),
    )
    consumers = ConsumerOffsets(offsets_uri)
    assert consumers.held_below("lake/users", [0], now_ms=2_000, table_id="t1", version=9) == {0: 7}
    consumers.commit(
        "lake/users", "billing", {0: 8}, clock=lambda: 3_000, table_id="t0", table_version=4
    )
    # Offsets committed for another table hold nothing; for this one (or older rows), they do.
    assert consumers.held_below("lake/users", [0], now_ms=4_000, table_id="t1", version=9) == {}
    assert consumers.held_below("lake/users", [0], now_ms=4_000, table_id="t0", version=4) == {0: 8}
    assert consumers.held_below("lake/users", [0], now_ms=4_000, table_id="t0", version=2) == {}
