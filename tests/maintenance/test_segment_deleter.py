"""Removed files leave storage after the history window; the window protects every reader.

Real Spark, real Delta: passes remove files, the deleter deletes what left the log
longer than ``file.delete.delay.ms`` ago, and every version inside the window
still reads whole.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from sinks import CleanerConfig, CompactedStateSink, ConfigError
from sinks.errors import ConcurrentCommitError
from sinks.log.committer import DELTA_RS
from sinks.log.history_window import (
    ALIGN_ATTEMPTS,
    DeltaLogListing,
    HistoryExpiredError,
    align_table_properties,
    list_delta_log,
    oldest_reachable_version,
    table_properties,
)
from sinks.log.location import LogLocation
from sinks.log.ownership import LOG_DESCRIPTION
from sinks.log.trimmed_log import on_a_trimmed_log
from sinks.maintenance.file_inventory import take_inventory
from sinks.maintenance.segment_deleter import checkpoint_table_window, delete_expired_files
from streaming.status.gauges import log_status
from streaming.status.status_render import render_json, render_table

WINDOW_MS = 12_000  # above a batch and its pass on a loaded 2-core machine


def rows_of(batch_id: int, keys: int = 6) -> list[tuple[str, str | None]]:
    return [
        (f"k{(batch_id + j) % keys}", None if (batch_id + j) % 5 == 4 else f"v{batch_id}.{j}")
        for j in range(8)
    ]


def expected_state(batches: range) -> dict[str, str]:
    state: dict[str, str] = {}
    for b in batches:
        for key, value in rows_of(b):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def state_dict(df) -> dict[str, str]:
    return {r["key"]: r["value"] for r in df.collect()}


def files_of(path: str, version: int) -> set[str]:
    table = DeltaTable(path, version=version)
    return set(pa.table(table.get_add_actions()).column("path").to_pylist())


# -- pure ------------------------------------------------------------------------------------


def test_one_knob_under_both_names():
    kafka = CleanerConfig.from_properties({"file.delete.delay.ms": "3600000"})
    delta = CleanerConfig.from_properties({"delta.deletedFileRetentionDuration": "interval 1 hour"})
    assert kafka == delta and kafka.file_delete_delay_ms == 3_600_000
    assert CleanerConfig().file_delete_delay_ms == 7 * 86_400_000  # Delta's default
    with pytest.raises(ConfigError, match="delta.deletedFileRetentionDuration"):
        CleanerConfig.from_properties({"delta.deletedFileRetentionDuration": "soon"})
    assert table_properties(7 * 86_400_000)["delta.deletedFileRetentionDuration"] == (
        "interval 1 week"
    )
    assert table_properties(1_500)["delta.logRetentionDuration"] == "interval 1500 milliseconds"
    assert checkpoint_table_window(0) == 60_000
    assert checkpoint_table_window(7 * 86_400_000) == 3_600_000


def test_oldest_reachable_version_is_the_first_inside_the_window_and_loadable():
    listing = DeltaLogListing({5: 100, 6: 200, 7: 300, 8: 400}, frozenset({6}), 6, 0)
    reach = oldest_reachable_version
    assert reach(listing, current_version=8, now_ms=450, window_ms=200) == 7
    assert reach(listing, current_version=8, now_ms=450, window_ms=10_000) == 6  # 5 unloadable
    assert reach(listing, current_version=8, now_ms=10_000, window_ms=1) == 8  # idle log


# -- real Delta tables -----------------------------------------------------------------------


def test_deletion_keeps_what_the_window_references_and_time_travel_fails_clearly(spark, lake):
    path = str(lake / "log")
    config = CleanerConfig(
        min_cleanable_dirty_ratio=0.0,
        file_delete_delay_ms=WINDOW_MS,
        log_retention_check_interval_ms=3_600_000,  # only the explicit vacuum() deletes
    )
    sink = CompactedStateSink(path, config=config)
    for b in range(4):
        sink(spark.createDataFrame(rows_of(b), "key string, value string"), b)
    properties = DeltaTable(path).metadata().configuration
    assert properties["delta.deletedFileRetentionDuration"] == "interval 12 seconds"
    assert properties["delta.logRetentionDuration"] == "interval 12 seconds"
    time.sleep(WINDOW_MS / 1000 + 0.5)  # batches 0-3 and their passes leave the window
    for b in range(4, 6):
        sink(spark.createDataFrame(rows_of(b), "key string, value string"), b)
    current = sink.log_table.snapshot().version
    states = {v: state_dict(sink.state(as_of=v)) for v in (current - 1, current)}

    started_ms = int(time.time() * 1000)
    snapshot = sink.log_table.snapshot()
    listing = list_delta_log(LogLocation(path))
    inside = [v for v, at in listing.commit_ms.items() if at >= started_ms - WINDOW_MS]
    protected = set().union(*(files_of(path, v) for v in [*inside, snapshot.version]))
    on_disk_before = {f.path for f in take_inventory(sink.log_table, snapshot).on_disk}

    report = sink.vacuum()

    deleted = set(report.deleted)
    assert deleted, "files removed before the window should have been deleted"
    assert not deleted & protected
    on_disk = {f.path for f in take_inventory(sink.log_table, snapshot).on_disk}
    assert on_disk == on_disk_before - deleted
    assert protected <= on_disk
    reach = log_status(sink).storage.oldest_reachable_version
    assert reach <= current
    for version, state in states.items():
        if version >= reach:  # still inside (a slow machine may have moved the window)
            assert state_dict(sink.state(as_of=version)) == state  # time travel inside works
    assert state_dict(sink.state()) == expected_state(range(6))

    expired = r"file\.delete\.delay\.ms.*interval 12 seconds"
    with pytest.raises(HistoryExpiredError, match=expired):
        sink.state(as_of=1)

    status = log_status(sink)
    assert status is not None and status.storage is not None
    storage = status.storage
    assert storage.window_ms == WINDOW_MS
    assert storage.files_on_disk == len(on_disk)
    assert storage.live_files == len(sink.log_table.snapshot().all_segments())
    assert storage.awaiting_deletion_files == len(on_disk) - storage.live_files
    assert storage.oldest_reachable_version > 1 and storage.delta_log_files > 0
    assert "time travel reaches v" in render_table([status])
    assert '"awaiting_deletion_bytes"' in render_json([status])

    again = sink.vacuum()  # idempotent: what it deletes now only expired since
    live = {s.path for s in sink.log_table.snapshot().all_segments()}
    assert not set(again.deleted) & (deleted | live)


def test_deletion_is_bounded_per_call_and_trims_the_delta_log(tmp_path):
    path = str(tmp_path / "table")
    schema = pa.schema([("k", pa.int64())])
    DeltaTable.create(
        path, schema, configuration=table_properties(60_000), description=LOG_DESCRIPTION
    )
    table = DeltaTable(path)
    previous = None
    os.makedirs(f"{path}/partition-0")
    for i in range(130):  # past Delta checkpoints (every 10 commits)
        name = f"partition-0/f{i}.parquet"
        pq.write_table(pa.table({"k": [i]}), f"{path}/{name}")
        actions = [AddAction(name, os.path.getsize(f"{path}/{name}"), {}, 0, True, None)]
        if previous is not None:
            actions.append(RemoveAction(previous, True, int(time.time() * 1000), 1, {}))
        table.create_write_transaction(actions, "append", schema)
        table.update_incremental()
        previous = name
    # delta-rs's post-commit hook wrote them
    checkpoint = max(list_delta_log(LogLocation(path)).checkpoints)
    # Nothing is older than the window yet: nothing goes, the log keeps every commit.
    first = delete_expired_files(LogLocation(path), window_ms=60_000)
    assert first.deleted == () and first.log_files_after == first.log_files_before

    report = delete_expired_files(LogLocation(path), window_ms=0, max_files=50)
    assert len(report.deleted) == 50 and report.left_for_next_call == 129 - 50
    assert report.properties_set
    rest = delete_expired_files(LogLocation(path), window_ms=0)
    assert len(rest.deleted) == 129 - 50 and rest.left_for_next_call == 0
    assert os.listdir(f"{path}/partition-0") == ["f129.parquet"]
    # Commits before the last Delta checkpoint are gone; the table still loads.
    assert min(list_delta_log(LogLocation(path)).commit_ms) >= checkpoint
    assert DeltaTable(path).version() == 131  # 130 commits and the window's new properties


def test_a_deleter_whose_table_was_trimmed_under_it_opens_it_again(tmp_path):
    """Two deleters of one log: the other's checkpoint and trim remove the checkpoint and
    commits this one's table was opened from, which delta-rs reads again for the vacuum's
    listing and for a checkpoint. The step is repeated on the table opened anew; before,
    ``vacuum()`` beside a streaming query's own deleter failed with "not found"."""
    path = str(tmp_path / "table")
    schema = pa.schema([("k", pa.int64())])
    DeltaTable.create(path, schema, configuration=table_properties(0), description=LOG_DESCRIPTION)
    os.makedirs(f"{path}/partition-0")

    def commit(i: int) -> None:
        name = f"partition-0/f{i}.parquet"
        pq.write_table(pa.table({"k": [i]}), f"{path}/{name}")
        actions = [AddAction(name, os.path.getsize(f"{path}/{name}"), {}, 0, True, None)]
        if i:
            actions.append(
                RemoveAction(f"partition-0/f{i - 1}.parquet", True, int(time.time() * 1000), 1, {})
            )
        DeltaTable(path).create_write_transaction(actions, "append", schema)

    for i in range(25):  # a checkpoint at 19 (delta-rs's post-commit hook)
        commit(i)
    location = LogLocation(path)
    stale = location.delta_table()  # from the checkpoint at 19 and commits 20 to 25
    for i in range(25, 32):  # a checkpoint at 29; the other deleter trims what it covers
        commit(i)
    DeltaTable(path).cleanup_metadata()

    def listing(table) -> list[str]:
        return sorted(table.vacuum(dry_run=True, full=True, enforce_retention_duration=False))

    with pytest.raises(Exception, match="not found"):
        listing(stale)
    assert on_a_trimmed_log(location, stale, listing) == listing(location.delta_table())
    assert len(listing(location.delta_table())) == 31  # every file but the live one
    on_a_trimmed_log(location, stale, lambda t: t.create_checkpoint())  # "no files in log segment"
    with pytest.raises(ZeroDivisionError):  # any other error is the caller's
        on_a_trimmed_log(location, stale, lambda t: 1 / 0)


class RacedCommitter:
    """delta-rs's committer, with another writer's commit landing just before each of its
    first ``races`` property commits: the race two sinks' deleters on one log run."""

    def __init__(self, other_writer, races: int = 1) -> None:
        self.other_writer, self.races = other_writer, races
        self.property_commits = 0

    def __getattr__(self, name: str):
        return getattr(DELTA_RS, name)

    def set_properties(self, table, properties, *, metadata) -> None:
        self.property_commits += 1
        if self.property_commits <= self.races:
            self.other_writer()
        DELTA_RS.set_properties(table, properties, metadata=metadata)


def _table_with_one_file(path: str) -> str:
    """A table with no window properties and one data file (version 1); its file's path."""
    schema, name = pa.schema([("k", pa.int64())]), "partition-0/a.parquet"
    DeltaTable.create(path, schema, description=LOG_DESCRIPTION)
    os.makedirs(f"{path}/partition-0")
    pq.write_table(pa.table({"k": [1]}), f"{path}/{name}")
    add = AddAction(name, os.path.getsize(f"{path}/{name}"), {}, 0, True, None)
    DeltaTable(path).create_write_transaction([add], "append", schema)
    return name


def test_two_deleters_setting_the_window_at_once_both_succeed(tmp_path):
    """The losing deleter finds the winner's properties and commits nothing; raising there
    failed a user's ``vacuum()`` beside a streaming query's own deleter."""
    path = str(tmp_path / "table")
    _table_with_one_file(path)
    wanted = table_properties(60_000)
    stale = DeltaTable(path)  # read before the other deleter commits
    raced = RacedCommitter(lambda: DELTA_RS.set_properties(DeltaTable(path), wanted, metadata={}))

    assert align_table_properties(stale, 60_000, raced) is False
    assert raced.property_commits == 1
    table = DeltaTable(path)
    assert table.version() == 2  # the winner's commit, and no second one
    assert {k: table.metadata().configuration[k] for k in wanted} == wanted

    report = delete_expired_files(LogLocation(path), window_ms=60_000)
    assert not report.properties_set and DeltaTable(path).version() == 2


def test_the_window_is_set_again_after_losing_to_a_commit_that_removed_files(tmp_path):
    path = str(tmp_path / "table")
    data_file = _table_with_one_file(path)
    removed = RemoveAction(data_file, True, int(time.time() * 1000), 1, {})
    schema = pa.schema([("k", pa.int64())])

    def remove_the_file() -> None:
        DeltaTable(path).create_write_transaction([removed], "append", schema)

    stale = DeltaTable(path)
    assert align_table_properties(stale, 60_000, RacedCommitter(remove_the_file)) is True
    table = DeltaTable(path)
    assert table.version() == 3 and table.history(1)[0]["operation"] == "SET TBLPROPERTIES"
    assert table.metadata().configuration["delta.deletedFileRetentionDuration"] == (
        "interval 1 minute"
    )

    # A race lost every time: the conflict, after ALIGN_ATTEMPTS commits.
    other = str(tmp_path / "other")
    _table_with_one_file(other)
    every_time = RacedCommitter(
        lambda: DELTA_RS.set_properties(
            DeltaTable(other), {"x.n": str(time.time_ns())}, metadata={}
        ),
        races=ALIGN_ATTEMPTS,
    )
    with pytest.raises(ConcurrentCommitError):
        align_table_properties(DeltaTable(other), 60_000, every_time)
    assert every_time.property_commits == ALIGN_ATTEMPTS
