"""The cleaner-offset checkpoint table: one Delta table, rows upserted per (log, partition)."""

from __future__ import annotations

from dataclasses import asdict

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.schema import Field
from testkit import arrow_append, checkpoint_and_trim

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from checkpoints.checkpoint_table import CHECKPOINT_SCHEMA
from checkpoints.keyed_table import KeyedTable
from sinks import CompactedStateSink


def test_rows_of_two_logs_share_one_table_and_are_upserted(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    assert table.read() == {} and table.logs() == []
    table.write(
        [
            CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=10),
            CheckpointEntry(log_path="lake/users", partition=1, first_dirty_offset=4),
        ]
    )
    table.write(
        [CheckpointEntry(log_path="lake/orders", partition=0, first_dirty_offset=7, bytes_read=9)]
    )
    table.write(
        [
            CheckpointEntry(
                log_path="lake/users",
                partition=0,
                first_dirty_offset=25,
                records_read=30,
                records_written=12,
                last_clean_ms=1_000,
            )
        ]
    )
    rows = table.read()
    assert {k: e.first_dirty_offset for k, e in rows.items()} == {
        ("lake/users", 0): 25,
        ("lake/users", 1): 4,
        ("lake/orders", 0): 7,
    }
    users0 = rows[("lake/users", 0)]
    assert (users0.records_read, users0.records_written, users0.last_clean_ms) == (30, 12, 1_000)
    assert users0.updated_ms is not None and users0.cleaner_state == "idle"
    assert set(table.read("lake/orders")) == {("lake/orders", 0)}
    assert table.logs() == ["lake/orders", "lake/users"]
    delta = DeltaTable(table.uri)
    assert delta.to_pyarrow_table().num_rows == 3  # upserts, not appends
    assert {"log_path", "partition", "first_dirty_offset"} <= set(delta.schema().to_arrow().names)


def test_writing_nothing_creates_nothing(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "chk"))
    table.write([])
    assert not (tmp_path / "chk").exists()


def test_compare_and_set_writes_only_over_the_row_it_read(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    first = CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=10)
    assert table.compare_and_set(None, first)
    assert not table.compare_and_set(None, first)  # a row exists now: None no longer matches
    read = table.read()[("lake/users", 0)]
    moved = read.with_changes(first_dirty_offset=20, cleaner_state="in_progress")
    assert table.compare_and_set(read, moved)
    assert not table.compare_and_set(read, read.with_changes(first_dirty_offset=30))  # stale
    assert table.read()[("lake/users", 0)].first_dirty_offset == 20
    properties = DeltaTable(table.uri).metadata().configuration
    assert properties["delta.checkpointInterval"] == "10"  # created in one place, with them


def test_every_write_leaves_the_table_one_file(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    table.open_or_create()
    for p in range(8):  # as an earlier version's MERGEs left it: a file per inserted row
        entry = CheckpointEntry(log_path="lake/users", partition=p, first_dirty_offset=0)
        rows = pa.Table.from_pylist([asdict(entry)], schema=CHECKPOINT_SCHEMA)
        write_deltalake(table.uri, rows, mode="append")
    assert len(DeltaTable(table.uri).file_uris()) == 8
    for offset in range(1, 7):  # transitions and upserts
        current = table.read()[("lake/users", offset % 8)]
        if offset % 2:
            assert table.compare_and_set(current, current.with_changes(first_dirty_offset=offset))
        else:
            table.write([current.with_changes(first_dirty_offset=offset)])
        assert len(DeltaTable(table.uri).file_uris()) == 1
    rows = table.read()
    assert len(rows) == 8 and rows[("lake/users", 6)].first_dirty_offset == 6


def test_a_write_against_a_version_another_write_followed_is_refused(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    table.open_or_create()  # empty: two inserts of different keys remove no file of each other
    keyed = table._keyed
    stale = keyed.open_or_create()
    first = CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=1)
    assert table.compare_and_set(None, first)
    second = pa.Table.from_pylist(
        [asdict(first.with_changes(partition=1))], schema=CHECKPOINT_SCHEMA
    )
    with pytest.raises(CommitFailedError):
        keyed._rewrite(stale, keyed._read(stale), second)
    assert set(table.read()) == {("lake/users", 0)}


def test_a_column_a_later_version_added_is_kept_by_a_write(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    table.write([CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=1)])
    DeltaTable(table.uri).alter.add_columns([Field("later", "string", nullable=True)])
    rows = DeltaTable(table.uri).to_pyarrow_table().to_pylist()
    rows[0]["later"] = "kept"
    write_deltalake(table.uri, pa.Table.from_pylist(rows), mode="overwrite")
    read = table.read()[("lake/users", 0)]
    assert table.compare_and_set(read, read.with_changes(first_dirty_offset=2))
    table.write([CheckpointEntry(log_path="lake/users", partition=1, first_dirty_offset=3)])
    stored = {r["partition"]: r for r in DeltaTable(table.uri).to_pyarrow_table().to_pylist()}
    assert (stored[0]["later"], stored[0]["first_dirty_offset"]) == ("kept", 2)
    assert stored[1]["later"] is None


def test_compare_and_set_many_swaps_the_rows_still_as_read_in_one_commit(tmp_path):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    fresh = [
        CheckpointEntry(log_path="lake/users", partition=p, first_dirty_offset=0) for p in (0, 1)
    ]
    created = table.compare_and_set_many([(None, e) for e in fresh])
    assert sorted(e.partition for e in created) == [0, 1] and len(table.read()) == 2
    read = table.read()
    stale = read[("lake/users", 1)]
    table.write([stale.with_changes(first_dirty_offset=5)])  # another writer moves row 1
    version = DeltaTable(table.uri).version()
    new_row = CheckpointEntry(log_path="lake/users", partition=2, first_dirty_offset=7)
    changes = [
        (read[("lake/users", 0)], read[("lake/users", 0)].with_changes(first_dirty_offset=10)),
        (stale, stale.with_changes(first_dirty_offset=11)),  # changed meanwhile: not written
        (None, new_row),
        (None, fresh[1].with_changes(first_dirty_offset=12)),  # has a row: not inserted
    ]
    written = table.compare_and_set_many(changes)
    assert sorted((e.partition, e.first_dirty_offset) for e in written) == [(0, 10), (2, 7)]
    assert DeltaTable(table.uri).version() == version + 1  # one commit for all of them
    rows = table.read("lake/users")
    assert {k[1]: e.first_dirty_offset for k, e in rows.items()} == {0: 10, 1: 5, 2: 7}
    assert rows[("lake/users", 0)] == written[0]  # the rows returned are the rows stored


def test_a_write_whose_read_version_was_trimmed_is_refused_as_a_conflict(tmp_path, monkeypatch):
    table = CleanerOffsetCheckpoint(str(tmp_path / "_cleaner-offset-checkpoint"))
    first = CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=0)
    table.write([first])
    read = table.read()[("lake/users", 0)]
    stale = [table._keyed.open_or_create(), table._keyed.open_or_create()]  # two writers read
    table.write([first.with_changes(partition=1)])  # another writer commits,
    checkpoint_and_trim(table.uri)  # checkpoints, and trims the commit the two read
    fresh = KeyedTable.open_or_create
    monkeypatch.setattr(
        KeyedTable, "open_or_create", lambda keyed: stale.pop() if stale else fresh(keyed)
    )
    assert not table.compare_and_set(read, read.with_changes(first_dirty_offset=5))
    table.write([first.with_changes(partition=2)])  # an upsert reads again and commits
    rows = table.read()
    assert sorted(p for _, p in rows) == [0, 1, 2] and rows[("lake/users", 0)] == read


def test_rows_are_stamped_by_the_clock_the_table_is_given(tmp_path, spark, clock_at):
    """A sink under a simulated clock stamps its checkpoint rows with that clock, as it
    stamps its records and horizons."""
    stamps = iter([5_000, 5_000, 9_000])
    table = CleanerOffsetCheckpoint(str(tmp_path / "cp"), clock=lambda: next(stamps))
    table.write([CheckpointEntry(log_path="lake/users", partition=0, first_dirty_offset=1)])
    (row,) = table.read().values()
    assert row.updated_ms == 5_000
    table.compare_and_set(row, row.with_changes(first_dirty_offset=2))
    (row,) = table.read().values()
    assert (row.first_dirty_offset, row.updated_ms) == (2, 5_001)  # past the row it replaced

    clock = clock_at(1_000_000)
    sink = CompactedStateSink(str(tmp_path / "log"), clock=clock)
    arrow_append(sink, [("a", "1"), ("a", "2")], "key string, value string", 0, spark=spark)
    clock.advance(60_000)
    sink.clean(force=True)
    rows = CleanerOffsetCheckpoint(sink.checkpoint_path).read().values()
    # the simulated clock's time (a stamp is also past the row it replaced), not the wall's
    assert rows and all(1_000_000 <= r.updated_ms <= 1_060_010 for r in rows)
