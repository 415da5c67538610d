"""Recovery on open: orphan files, checkpoint reconciliation, offset verification, the marker."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid

import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties
from testkit import kv_frame, segment, state_of, unreferenced_files

from checkpoints import CheckpointEntry, CleanerOffsetCheckpoint
from sinks import CleanerConfig, CompactedStateSink, LogCorruptedError
from sinks.log.log_format import COMMIT_INFO_KEY
from sinks.log.log_table import LogTable
from sinks.log.segment import segment_path
from sinks.maintenance.recovery import (
    CLEAN_SHUTDOWN_MARKER,
    FileOnDisk,
    find_orphans,
    offset_problems,
    read_clean_shutdown_marker,
    reconciled_dirty_offset,
    recover_log,
)

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
HOUR_MS = 3_600_000


# -- pure -----------------------------------------------------------------------------------


def test_find_orphans_respects_references_grace_and_live_passes():
    a, b, c = (segment_path(0, base, uuid.uuid4().hex) for base in (0, 10, 20))
    files = [
        FileOnDisk(a, 1, 0),
        FileOnDisk(b, 1, 0),
        FileOnDisk(c, 1, 9_500),
        FileOnDisk(segment_path(1, 0, uuid.uuid4().hex), 1, 0),
    ]
    old, young = find_orphans(
        files,
        {a},
        now_ms=10_000,
        file_delete_delay_ms=1_000,
        protected_partitions=[1],
    )
    assert (old, young) == ([b], [c])


@pytest.mark.parametrize(
    ("log_offset", "checkpointed", "expected"),
    [
        (40, 10, 40),  # pass committed, checkpoint not written: roll forward
        (40, None, 40),
        (None, 10, 10),
        (None, None, None),
        (None, 500, 5),  # above the log end: reset to the log start, as Kafka does
        (None, 2, 5),  # below the log start (retention moved it): reset
        (3, 3, 5),
    ],
)
def test_reconciled_dirty_offset(log_offset, checkpointed, expected):
    assert (
        reconciled_dirty_offset(
            log_cleaner_offset=log_offset,
            checkpointed=checkpointed,
            log_start_offset=5,
            log_end_offset=100,
        )
        == expected
    )


def test_offset_problems_finds_overlap_and_offsets_past_log_end():
    a = segment(0, 0, 9, path="a")
    b = segment(0, 9, 12, path="b")
    problems = offset_problems({0: [a, b]}, {0: 12})
    assert any("overlaps" in p for p in problems)
    assert any("log end offset 12" in p for p in problems)
    assert offset_problems({0: [a, segment(0, 10, 12, path="c")]}, {0: 13}) == []


# -- on real logs ---------------------------------------------------------------------------


def _plant_orphan(path: str, name: str, *, age_ms: int) -> str:
    source = next(
        os.path.join(path, "partition-0", f) for f in os.listdir(os.path.join(path, "partition-0"))
    )
    target = os.path.join(path, "partition-0", name)
    shutil.copy(source, target)
    stamp = time.time() - age_ms / 1000
    os.utime(target, (stamp, stamp))
    return f"partition-0/{name}"


def test_recovery_removes_old_orphans_keeps_young_ones_and_time_travel_files(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(kv_frame(spark, [("a", "1"), ("b", "1")]), 0)
    sink(kv_frame(spark, [("a", "2"), ("c", "1")]), 1)
    sink.clean(force=True)  # the two appended files are removed, still on disk for time travel
    old = _plant_orphan(path, f"{0:020d}-{'a' * 32}.parquet", age_ms=HOUR_MS)  # killed append
    young = _plant_orphan(path, f"{0:020d}-{'b' * 32}.parquet", age_ms=0)  # in flight
    assert unreferenced_files(path) == sorted([old, young])

    report = recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=60_000)

    assert report.orphans_removed == (old,)
    assert report.orphans_kept_young == (young,)
    assert unreferenced_files(path) == [young]
    assert state_of(sink) == {"a": "2", "b": "1", "c": "1"}
    rows = sink.state(as_of=1).collect()  # files removed by the pass still serve time travel
    assert sorted((r["key"], r["value"]) for r in rows) == [("a", "1"), ("b", "1")]
    again = recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    assert again.orphans_removed == (young,) and again.checkpoint_changes == {}
    assert unreferenced_files(path) == []


def test_checkpoint_rolled_forward_from_log_and_reset_into_range(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    rows = [(f"k{i % 3}", str(i), i % 2) for i in range(12)]
    sink(kv_frame(spark, rows, partition=True), 0)
    sink.clean(force=True)
    snapshot = sink.log_table.snapshot()
    assert snapshot.cleaner_offset(0) == 6
    # A crash between the pass's commit and its checkpoint: the row still has the old offset.
    checkpoints = CleanerOffsetCheckpoint(sink.checkpoint_path)
    checkpoints.write(
        [
            CheckpointEntry(log_path=path, partition=0, first_dirty_offset=0),
            CheckpointEntry(log_path=path, partition=1, first_dirty_offset=0),
        ]
    )
    report = recover_log(sink.log_table, checkpoints, file_delete_delay_ms=0)
    assert report.checkpoint_changes == {0: (0, 6), 1: (0, 6)}
    assert {p: e.first_dirty_offset for (_, p), e in checkpoints.read(path).items()} == {0: 6, 1: 6}

    # A partition never cleaned with a checkpoint above its log end: reset to the log start.
    sink(kv_frame(spark, [("z", "1", 2)], partition=True), 1)
    checkpoints.write([CheckpointEntry(log_path=path, partition=2, first_dirty_offset=99)])
    report = recover_log(sink.log_table, checkpoints, file_delete_delay_ms=0)
    assert report.checkpoint_changes == {2: (99, 0)}


def test_clean_shutdown_marker_limits_the_full_check_to_new_files(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(kv_frame(spark, [("a", "1"), ("b", "1")]), 0)
    sink(kv_frame(spark, [("c", "1")]), 1)  # the sink recovered the log before this append
    assert sink.last_recovery is not None
    os.remove(os.path.join(path, CLEAN_SHUTDOWN_MARKER))  # as after a crash of an old version
    first = recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    assert first.full and first.files_checked == 2
    assert read_clean_shutdown_marker(sink.log_table) == first.version
    second = recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    assert not second.full and second.files_checked == 0
    sink(kv_frame(spark, [("d", "1")]), 2)
    third = recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    assert not third.full and third.files_checked == 1

    sink(kv_frame(spark, [("e", "1")]), 3)
    sink.close()  # a clean shutdown vouches for the last commit
    restarted = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    assert restarted.recover().files_checked == 0


def _commit_copy(path: str, *, stats_offsets: tuple[int, int] | None = None) -> None:
    """Commit a copy of a live file under a new name (duplicate offsets), maybe with lying stats."""
    log_dir = os.path.join(path, "_delta_log")
    adds = [
        json.loads(line)["add"]
        for name in sorted(os.listdir(log_dir))
        if name.endswith(".json")
        for line in open(os.path.join(log_dir, name))
        if '"add"' in line
    ]
    first = adds[0]
    stats = json.loads(first["stats"])
    if stats_offsets is not None:
        stats["minValues"]["offset"], stats["maxValues"]["offset"] = stats_offsets
    # Named and committed as the sink names and commits its own files: the corruption is
    # the sink's, not another engine's (which `sinks.log.foreign.commits` stops at).
    name = segment_path(0, stats["minValues"]["offset"], uuid.uuid4().hex)
    shutil.copy(os.path.join(path, first["path"]), os.path.join(path, name))
    action = AddAction(name, first["size"], {}, int(time.time() * 1000), True, json.dumps(stats))
    table = DeltaTable(path)
    table.create_write_transaction(
        [action],
        "append",
        table.schema(),
        commit_properties=CommitProperties(
            custom_metadata={COMMIT_INFO_KEY: {"operation": "append"}}
        ),
    )


def test_duplicated_offsets_are_detected_and_nothing_is_deleted(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(kv_frame(spark, [("a", "1"), ("b", "1")]), 0)
    _commit_copy(path)
    with pytest.raises(LogCorruptedError, match="overlaps"):
        recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    assert len(LogTable(path).snapshot().all_segments()) == 2


def test_full_check_catches_statistics_that_lie(spark, lake, clock):
    path = str(lake / "log")
    sink = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    sink(kv_frame(spark, [("a", "1"), ("b", "1")]), 0)
    recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
    # The copy claims offsets [100, 101], but holds 0 and 1: only reading the file shows it.
    _commit_copy(path, stats_offsets=(100, 101))
    with pytest.raises(LogCorruptedError, match=r"its statistics say 2 in \[100, 101\]"):
        recover_log(sink.log_table, sink.checkpoints, file_delete_delay_ms=0)
