"""The cleaner-offset checkpoint table: one Delta table, rows upserted per (log, partition)."""

from __future__ import annotations

from deltalake import DeltaTable

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint


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
