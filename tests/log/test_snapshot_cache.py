"""A log is opened once between two commits (design.md §46): every caller of a `LogTable`
gets the snapshot it read last while no commit followed it, and a new one after any commit,
of its own or another writer's, and after the table was dropped and created again."""

from __future__ import annotations

import pickle
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import StringType, StructField, StructType
from testkit import checkpoint_and_trim

from sinks.log.location import LogLocation
from sinks.log.log_table import LogTable
from sinks.produce.schema_commit import commit_schema


def new_log(path: str) -> LogTable:
    """A table of two rows, and a commit of the sink's own on it (the version it checked)."""
    write_deltalake(path, pa.table({"key": ["a", "b"], "offset": pa.array([0, 1], pa.int64())}))
    log = LogTable(path)
    commit_nothing(log)
    return log


def commit_nothing(log: LogTable) -> None:
    snapshot = log.snapshot()
    assert snapshot is not None
    snapshot.commit(data_change=False, transactions={}, info={"operation": "test"})


@pytest.fixture
def opens(monkeypatch) -> list[int | None]:
    """The versions asked of each open of a log's Delta table (None: the latest)."""
    asked: list[int | None] = []
    real = LogLocation.delta_table

    def counted(self, version=None):
        asked.append(version)
        return real(self, version)

    monkeypatch.setattr(LogLocation, "delta_table", counted)
    return asked


def test_between_two_commits_every_caller_gets_the_snapshot_read_first(tmp_path, opens):
    log = new_log(str(tmp_path / "t"))
    first = log.snapshot()
    assert first is not None and first.verified
    read = len(opens)
    assert log.snapshot() is first and log.snapshot(repair=False) is first
    assert first.log_end_offsets() == log.snapshot().log_end_offsets()
    assert len(opens) == read  # no open, no txn lookup again

    unverified = log.snapshot(verify=False)
    assert unverified is not first and not unverified.verified
    assert log.snapshot(verify=False) is unverified

    commit_nothing(log)
    after = log.snapshot()
    assert after is not first and after.version == first.version + 1
    assert log.snapshot(verify=False).version == after.version


def test_another_writers_commit_is_read(tmp_path):
    path = str(tmp_path / "t")
    log = new_log(path)
    first = log.snapshot()
    commit_nothing(LogTable(path))  # another sink on the same log, in another process say
    assert log.snapshot().version == first.version + 1


def test_a_table_dropped_and_created_again_at_as_many_versions_is_read_again(tmp_path):
    path = str(tmp_path / "t")
    log = new_log(path)
    first = log.snapshot()
    shutil.rmtree(path)
    new_log(path)  # the same commits again: the same versions, files of the same sizes
    again = log.snapshot()
    assert again.version == first.version
    assert again is not first and again.table_id != first.table_id


def test_an_older_copy_put_back_is_read_again(tmp_path):
    path, backup = str(tmp_path / "t"), str(tmp_path / "backup")
    log = new_log(path)
    shutil.copytree(path, backup)
    old = log.snapshot().version
    commit_nothing(log)
    assert log.snapshot().version == old + 1
    shutil.rmtree(path)
    shutil.copytree(backup, path)
    assert log.snapshot().version == old


def test_a_time_travel_read_is_not_kept(tmp_path):
    log = new_log(str(tmp_path / "t"))
    latest = log.snapshot()
    older = log.snapshot(0)
    assert older.version == 0 and log.snapshot() is latest


def test_a_pickled_log_table_carries_no_snapshot(tmp_path):
    log = new_log(str(tmp_path / "t"))
    first = log.snapshot()
    shipped = pickle.loads(pickle.dumps(log))
    assert shipped.latest.get(shipped.location, verified=True) is None
    assert shipped.snapshot().version == first.version


def test_a_schema_commit_leaves_the_snapshot_it_was_made_against_at_its_version(tmp_path):
    log = new_log(str(tmp_path / "t"))
    snapshot = log.snapshot()
    wider = StructType([*snapshot.spark_schema.fields, StructField("note", StringType())])
    assert commit_schema(snapshot, wider, info={"operation": "test"})
    assert snapshot.table.version() == snapshot.version  # other holders see what they read
    assert "note" not in snapshot.spark_schema.names
    after = log.snapshot()
    assert after.version == snapshot.version + 1 and "note" in after.spark_schema.names
    assert DeltaTable(log.uri).version() == after.version


def test_a_kept_snapshot_whose_commit_files_were_trimmed_reads_its_txns_from_the_checkpoint(
    tmp_path,
):
    """A snapshot opened from commit files that a checkpoint written after the open made
    removable, and another process's trim then removed, while its version is still the
    latest: its next `txn` lookup reads the version again from the checkpoint."""
    path = str(tmp_path / "t")
    log = new_log(path)
    commit_nothing(log)
    first = log.snapshot()
    assert first is not None and first.version == 2
    assert checkpoint_and_trim(path) == first.version  # by another writer, at the same version

    assert log.snapshot() is first  # still the latest version
    assert first.txn_version("another-app") is None
    assert first.log_end_offsets() == LogTable(path).snapshot().log_end_offsets()
    commit_nothing(log)  # and a commit against it lands at the next version
    assert log.snapshot().version == first.version + 1
