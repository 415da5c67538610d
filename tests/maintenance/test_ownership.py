"""The sink touches only what it owns: someone else's files and tables survive every step.

Pure rules first (`sinks.log.ownership`: which paths are the sink's own, which tables are
compacted logs, what a directory without a table may hold). Then real Spark and real
Delta on disk: a directory of someone else's Parquet files and a plain Delta table written
by delta-rs are refused with nothing written; and a log whose directory, subfolders and
lake hold a stranger's files (eight days old) goes through dozens of appends, passes,
retention, ``delete_records``, recovery on reopen and vacuum, and every byte of those
files is still there, the plain table's version unchanged.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from testkit import arrow_append, assert_offsets_unique, kv_frame

from sinks import CleanerConfig, CompactedStateSink, NotACompactedLogError, read_state
from sinks.log.location import LogLocation
from sinks.log.ownership import (
    foreign_entries,
    foreign_files,
    is_delta_rs_data_path,
    is_own_data_path,
    log_mark,
)
from sinks.log.segment import segment_path
from sinks.maintenance.file_inventory import take_inventory
from sinks.maintenance.recovery import FileOnDisk, find_orphans
from sinks.maintenance.segment_deleter import delete_expired_files

EIGHT_DAYS_S = 8 * 86_400
UUID = "0123456789abcdef0123456789abcdef"


# -- pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "ours"),
    [
        (f"partition-0/{0:020d}-{UUID}.parquet", True),
        (f"partition-12/{42:020d}-{UUID}.parquet", True),
        (f"/partition-3/{7:020d}-{UUID}.parquet", True),
        (f"_staging/{UUID}.parquet", True),
        ("partition-0/data.parquet", False),  # someone else's, in the sink's own folder
        (f"partition-0/{0:020d}.parquet", False),  # no unique part
        (f"partition-x/{0:020d}-{UUID}.parquet", False),
        (f"partition-0/{0:020d}-{UUID}.parquet.bak", False),
        (f"backup/partition-0/{0:020d}-{UUID}.parquet", False),  # a copy, one level down
        (f"{0:020d}-{UUID}.parquet", False),
        ("part-00000-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0-c000.snappy.parquet", False),
        ("_staging/theirs.parquet", False),
        ("data.txt", False),
    ],
)
def test_own_data_paths_are_the_sinks_naming_only(path, ours):
    assert is_own_data_path(path) is ours


def test_delta_rs_naming_is_what_delta_rs_writes(tmp_path):
    write_deltalake(str(tmp_path / "t"), pa.table({"a": [1]}))
    (written,) = DeltaTable(str(tmp_path / "t")).file_uris()
    assert is_delta_rs_data_path(Path(written).name)
    assert not is_delta_rs_data_path("part-0.parquet")
    assert not is_own_data_path(Path(written).name)


def test_a_location_without_a_table_may_hold_only_what_a_killed_first_batch_leaves():
    mine = [
        ("partition-0", True),
        (f"partition-0/{0:020d}-{UUID}.parquet", False),
        ("_staging", True),
        (f"_staging/{UUID}.parquet", False),
        ("_compacted_sink", True),
        ("_compacted_sink/clean-shutdown.json", False),
        ("_delta_log", True),
    ]
    assert foreign_entries(mine) == []
    theirs = [
        ("part-0.parquet", False),
        ("important", True),
        ("important/data.txt", False),
        ("partition-0/theirs.parquet", False),
        ("_delta_log/00000000000000000000.json", False),  # a table delta-rs cannot load
    ]
    assert foreign_entries(mine + theirs) == [
        "_delta_log/00000000000000000000.json",
        "important/",
        "important/data.txt",
        "part-0.parquet",
        "partition-0/theirs.parquet",
    ]


def test_a_compacted_log_is_known_by_any_of_its_marks():
    assert log_mark({"compacted.sink.key.columns": '["key"]'}, None, None)
    assert log_mark({}, "compacted-state log", None)  # every log, since the first version
    assert log_mark({}, "renamed by someone", 3)  # appends always committed this txn
    assert log_mark({"delta.appendOnly": "true"}, None, None) is None
    assert log_mark({}, "my table", None) is None


def test_orphans_are_only_the_sinks_own_files_whatever_the_age():
    own = segment_path(0, 5, UUID)
    files = [
        FileOnDisk(own, 1, 0),
        FileOnDisk("partition-0/theirs.parquet", 1, 0),
        FileOnDisk("events/part-1.parquet", 1, 0),
    ]
    old, young = find_orphans(files, set(), now_ms=10**13, file_delete_delay_ms=0)
    assert (old, young) == ([own], [])
    named = {"events/part-1.parquet"}  # named by a commit: the log's, whatever its name
    assert foreign_files([f.path for f in files], named) == ["partition-0/theirs.parquet"]


# -- real Spark, real Delta ------------------------------------------------------------------


def digest(paths) -> dict[str, str]:
    """Every byte of every file under ``paths`` (files or directories), by path."""
    found = {}
    for root in map(Path, paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            found[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return found


def age(path: Path, seconds: int = EIGHT_DAYS_S) -> None:
    then = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (then, then))


def stranger_parquet(path: Path, n: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(n)), "note": ["theirs"] * n}), path)
    age(path)
    return path


def test_a_directory_of_someone_elses_files_is_refused_and_left_as_it_was(spark, lake):
    events = lake / "existing" / "events"
    stranger_parquet(events / "part-0001.parquet")
    stranger_parquet(events / "date=2026-11-01" / "part-0002.parquet")
    before = digest([lake])
    with pytest.raises(NotACompactedLogError) as refused:
        CompactedStateSink(str(events))
    message = str(refused.value)
    assert "is not a compacted log: it is not a Delta table" in message
    assert "3 entries the sink did not write" in message  # two files and a folder
    assert "date=2026-11-01/" in message and "part-0001.parquet" in message
    assert "Choose a new path for the log, or move those files away" in message
    assert refused.value.path == str(events)
    # A sink made before the files arrived refuses at its first batch, writing nothing.
    later = lake / "later"
    sink = CompactedStateSink(str(later))
    stranger_parquet(later / "theirs.parquet")
    with pytest.raises(NotACompactedLogError):
        sink(kv_frame(spark, [("a", "1")]), 0)
    assert sorted(os.listdir(later)) == ["theirs.parquet"]
    assert digest([events]) == {k: v for k, v in before.items() if k.startswith(str(events))}
    assert not (events / "_delta_log").exists()
    assert sorted(os.listdir(events)) == ["date=2026-11-01", "part-0001.parquet"]


def test_a_plain_delta_table_is_refused_by_the_sink_and_by_readers(spark, lake):
    plain = str(lake / "plain")
    write_deltalake(plain, pa.table({"id": [1, 2], "name": ["a", "b"]}))
    before = digest([lake])
    for open_it in (
        lambda: CompactedStateSink(plain),
        lambda: CompactedStateSink(plain, key_columns=["id"]),
        lambda: read_state(plain),
        lambda: delete_expired_files(LogLocation(plain), window_ms=0),
    ):
        with pytest.raises(NotACompactedLogError, match="is not a compacted log: it is a Delta"):
            open_it()
    with pytest.raises(NotACompactedLogError) as refused:
        read_state(plain)
    assert "columns id, name" in str(refused.value)
    assert "Nothing was written to it" in str(refused.value)
    assert DeltaTable(plain).version() == 0
    assert DeltaTable(plain).metadata().configuration == {}
    assert digest([lake]) == before


def test_strangers_files_in_and_beside_a_log_survive_a_long_run(spark, lake, clock):
    path = lake / "users"
    config = CleanerConfig(
        cleanup_policy="compact,delete",
        min_cleanable_dirty_ratio=0.3,
        delete_retention_ms=0,
        retention_ms=12_000,  # a dozen batches of the fake clock
        file_delete_delay_ms=0,  # removed files leave storage at once
        log_retention_check_interval_ms=0,
    )
    sink = CompactedStateSink(str(path), config=config, clock=clock, cleaning="inline")
    sink(kv_frame(spark, [(f"k{i}", "v0", i % 2) for i in range(8)], partition=True), 0)

    plain = lake / "plain"
    write_deltalake(str(plain), pa.table({"id": [1, 2, 3]}))
    write_deltalake(str(plain), pa.table({"id": [4]}), mode="append")
    plain_version = DeltaTable(str(plain)).version()
    delta_rs_named = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    strangers = [
        stranger_parquet(path / "notes.parquet"),
        stranger_parquet(path / delta_rs_named),  # looks like any Delta writer's file
        stranger_parquet(path / "partition-0" / "theirs.parquet"),
        stranger_parquet(path / "partition-1" / f"{0:020d}.parquet"),
        stranger_parquet(path / "backup" / "2026" / "part-1.parquet"),
        stranger_parquet(path / "_staging" / "theirs.parquet"),
        stranger_parquet(lake / "other.parquet"),
        stranger_parquet(lake / "important" / "data.parquet"),
    ]
    for text in (path / "README.txt", lake / "important" / "data.txt"):
        text.write_text("someone else's")
        age(text)
    age(plain)
    watched = [*strangers, path / "README.txt", lake / "important", plain]
    before = digest(watched)
    # An orphan of the sink's own (a killed append's file): recovery removes it.
    orphan = path / segment_path(0, 10**9, UUID)
    orphan.write_bytes(b"a killed append's file")
    age(orphan)

    passes = []
    sink = CompactedStateSink(str(path), config=config, clock=clock, cleaning="inline")
    sink.add_pass_listener(passes.append)
    for batch_id in range(1, 37):
        clock.advance(1_000)
        rows = [(f"k{(batch_id * 3 + j) % 8}", f"v{batch_id}.{j}", j % 2) for j in range(6)]
        if batch_id % 5 == 0:
            rows.append((f"k{batch_id % 8}", None, batch_id % 8 % 2))
        # Fed without Spark (`testkit.arrow_append`, the sink's own append): the files
        # are under test here; the first batch above came through Spark.
        arrow_append(sink, rows, "key string, value string, partition int", batch_id, spark=spark)
        if batch_id == 18:
            sink.delete_records(1, sink.log_table.snapshot().log_end_offset(1) - 4)
        assert digest(watched) == before, f"a stranger's file changed at batch {batch_id}"
    report = sink.last_recovery
    assert report is not None and not orphan.exists()
    assert str(orphan.relative_to(path)) in report.orphans_removed
    inside = {str(p.relative_to(path)) for p in strangers if path in p.parents}
    # Reported, except under "_" folders, which recovery never lists (only "_staging" is ours).
    assert {p for p in inside if not p.startswith("_")} <= set(report.not_ours)
    assert passes, "no pass ran"
    snapshot = sink.log_table.snapshot()
    assert any(snapshot.log_start_offset(p) > 0 for p in snapshot.partitions), "no retention"

    reopened = CompactedStateSink(str(path), config=config, clock=clock, cleaning="inline")
    recovered = reopened.recover()
    assert recovered.orphans_removed == ()
    reopened.clean(force=True)
    vacuumed = reopened.vacuum()
    assert not any(not is_own_data_path(p) for p in vacuumed.deleted)
    inventory = take_inventory(reopened.log_table, reopened.log_table.snapshot())
    assert {f.path for f in inventory.not_ours()} >= {"notes.parquet", delta_rs_named}
    assert all(is_own_data_path(f.path) for f, _ in inventory.awaiting_deletion(0))
    assert_offsets_unique(str(path))
    assert reopened.state().count() > 0

    assert digest(watched) == before
    assert DeltaTable(str(plain)).version() == plain_version
    assert DeltaTable(str(plain)).metadata().configuration == {}
