"""The CLI touches only what it owns: someone else's tables, directories and files.

The commands of a test run one after the other in one fresh process whose ``SPARK_HOME``
points nowhere (`no_spark_cli`: a refusal never needs Spark). On a plain Delta table
written by delta-rs, and on a directory of someone else's files, every command fails with
one line saying what the path is and what to do, and commits, writes and deletes nothing.
On a log whose directory and lake hold a stranger's files, ``status``, ``vacuum``,
``export`` and ``clean`` leave every byte of them. ``demo`` refuses a directory that is not
an earlier demo's lake, and still re-runs on its own.
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

from sinks import CleanerConfig, CompactedStateSink, NotACompactedLogError
from streaming.jobs.demo import DEMO_MARKER, DemoSettings, check_lake, demo_strangers, run

EIGHT_DAYS_S = 8 * 86_400


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def stranger(path: Path, text: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        pq.write_table(pa.table({"id": [1, 2, 3]}), path)
    else:
        path.write_text(text)
    then = time.time() - EIGHT_DAYS_S
    os.utime(path, (then, then))
    return path


COMMANDS = [
    ("status",),
    ("status", "--json"),
    ("vacuum",),
    ("clean", "--once"),
    ("clean", "--once", "--force", "--vacuum"),
    ("export", "--to", "out"),
    ("accept",),
    ("restore", "--to-version", "0"),
    ("configs", "--describe"),
    ("configs", "--alter", "--add-config", "delete.retention.ms=1000"),
    ("consumers",),
]


def command_on(command: tuple[str, ...], path: str) -> list[str]:
    if command[0] == "configs":
        return [command[0], "--path", path, *command[1:]]
    return [command[0], path, *command[1:]]


def test_every_command_refuses_a_plain_delta_table_and_commits_nothing(no_spark_cli, tmp_path):
    plain = tmp_path / "lake" / "events"
    write_deltalake(str(plain), pa.table({"id": [1, 2], "name": ["a", "b"]}))
    write_deltalake(str(plain), pa.table({"id": [3], "name": ["c"]}), mode="append")
    before = digest(tmp_path)
    results = no_spark_cli(*[command_on(c, "lake/events") for c in COMMANDS], cwd=tmp_path)
    # Every command has run: a commit or a write by any of them shows in the table and bytes.
    assert DeltaTable(str(plain)).version() == 1
    assert DeltaTable(str(plain)).metadata().configuration == {}
    assert digest(tmp_path) == before
    for command, result in zip(COMMANDS, results, strict=True):
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"compacted-sink {command[0]}: NotACompactedLogError: "), line
        assert (
            "lake/events is not a compacted log: it is a Delta table (Delta v1, columns id, name)"
            in line
        )
        assert "Nothing was written to it" in line and "KeyError" not in line
    assert sorted(os.listdir(tmp_path)) == ["lake"]  # no export, no checkpoint table
    assert sorted(os.listdir(tmp_path / "lake")) == ["events"]


def test_every_command_refuses_a_directory_of_someone_elses_files(no_spark_cli, tmp_path):
    events = tmp_path / "existing" / "events"
    stranger(events / "part-0001.parquet")
    stranger(events / "2026" / "part-0002.parquet")
    before = digest(tmp_path)
    results = no_spark_cli(*[command_on(c, "existing/events") for c in COMMANDS], cwd=tmp_path)
    assert digest(tmp_path) == before  # after every command
    for command, result in zip(COMMANDS, results, strict=True):
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        if command[0] == "export":  # the export's own check (sinks/reading/arrow_export.py)
            assert "no compacted log at" in result.stderr, result.stderr
        else:
            assert "is not a compacted log: it is not a Delta table" in result.stderr, command
            assert "part-0001.parquet" in result.stderr
    assert not (events / "_delta_log").exists()


def test_commands_on_a_log_leave_a_strangers_files_in_and_beside_it(spark, no_spark_cli, tmp_path):
    lake = tmp_path / "lake"
    config = CleanerConfig(min_cleanable_dirty_ratio=0.01, file_delete_delay_ms=0)
    sink = CompactedStateSink(str(lake / "users"), config=config)
    for batch_id in range(4):
        rows = [(f"k{i}", f"v{batch_id}", i % 2) for i in range(20)]
        sink(spark.createDataFrame(rows, "key string, value string, partition int"), batch_id)
    sink.close()
    strangers = [
        stranger(lake / "users" / "notes.parquet"),
        stranger(lake / "users" / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"),
        stranger(lake / "users" / "partition-0" / "theirs.parquet"),
        stranger(lake / "users" / "old" / "part-1.parquet"),
        stranger(lake / "users" / "README.txt", "someone else's"),
        stranger(lake / "important" / "data.txt", "someone else's"),
        stranger(lake / "other.parquet"),
    ]
    write_deltalake(str(lake / "plain"), pa.table({"id": [1]}))
    watched = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in strangers}
    plain_before = digest(lake / "plain")
    commands = [
        ("status", "lake/users"),
        ("vacuum", "lake/users"),
        ("export", "lake/users", "--to", "export", "--verify"),
        ("clean", "lake/users", "--once", "--force", "--vacuum"),
        ("status", "lake/users"),
    ]
    for command, result in zip(commands, no_spark_cli(*commands, cwd=tmp_path), strict=True):
        assert result.returncode == 0, (command, result.stderr)
    # After every command: a stranger's file changed or deleted by any of them shows here.
    now = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in strangers}
    assert now == watched
    assert digest(lake / "plain") == plain_before


# -- demo ------------------------------------------------------------------------------------


def test_demo_strangers_are_whatever_an_earlier_demo_did_not_write():
    demo = [
        (DEMO_MARKER, False),
        ("users", True),
        ("users/_delta_log", True),
        ("users/_delta_log/00000000000000000000.json", False),
        ("users/partition-0", True),
        (f"users/partition-0/{0:020d}-{'a' * 32}.parquet", False),
        ("users/_compacted_sink/clean-shutdown.json", False),
        ("_cleaner-offset-checkpoint", True),
        ("_cleaner-offset-checkpoint/_delta_log/00000000000000000001.json", False),
        (f"_cleaner-offset-checkpoint/part-00001-{uuid.uuid4()}-c000.zstd.parquet", False),
        ("_chk", True),
        ("_chk/users", True),
        ("_chk/users/metadata", False),
        ("_chk/users/.metadata.crc", False),
        ("_chk/users/offsets", True),
        ("_chk/users/offsets/0", False),
        ("_chk/users/offsets/.0.crc", False),
        ("_chk/users/commits/12", False),
        ("_chk/users/commits/.12.crc", False),
        (f"_chk/users/commits/.13.{uuid.uuid4()}.tmp", False),
        (f"_chk/users/commits/..13.{uuid.uuid4()}.tmp.crc", False),  # a stop between the two
        ("_chk/users/sources/0/0", False),
    ]
    assert demo_strangers(demo) == []
    theirs = [
        ("important", True),
        ("important/data.txt", False),
        ("users/notes.parquet", False),
        ("_chk/users/mine.txt", False),
        ("_cleaner-offset-checkpoint/theirs.parquet", False),
    ]
    assert demo_strangers(demo + theirs) == [
        "_chk/users/mine.txt",
        "_cleaner-offset-checkpoint/theirs.parquet",
        "important/",
        "important/data.txt",
        "users/notes.parquet",
    ]


def test_demo_refuses_a_users_directory_before_spark_starts(no_spark_cli, tmp_path):
    data = stranger(tmp_path / "mylake" / "important" / "data.txt", "keep me")
    (result,) = no_spark_cli(("demo", "--lake", "mylake"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "is not an earlier demo's lake" in result.stderr
    assert "Nothing was deleted" in result.stderr
    assert data.read_text() == "keep me"
    assert sorted(os.listdir(tmp_path / "mylake")) == ["important"]


def test_demo_reruns_on_its_own_lake_and_refuses_one_with_a_strangers_file(spark, tmp_path):
    lake = tmp_path / "demo"
    settings = DemoSettings(lake=str(lake), batches=3, rows_per_batch=40, keys=30, partitions=2)
    lines: list[str] = []
    assert run(spark, settings, out=lines.append)
    assert (lake / DEMO_MARKER).is_file()
    assert run(spark, settings, out=lines.append)  # its own earlier lake: wiped, run again

    note = stranger(lake / "users" / "notes.parquet")
    before = digest(lake)
    with pytest.raises(NotACompactedLogError, match="holds 1 file.* the demo did not write"):
        check_lake(lake)
    with pytest.raises(NotACompactedLogError):
        run(spark, settings, out=lines.append)
    assert digest(lake) == before and note.exists()
    note.unlink()

    (lake / DEMO_MARKER).unlink()  # a lake of the same layout that no demo marked (a user's)
    with pytest.raises(NotACompactedLogError, match="no compacted-sink-demo.json"):
        check_lake(lake)
    assert (lake / "users" / "_delta_log").is_dir()
