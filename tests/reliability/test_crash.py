"""design.md §10: processes killed with SIGKILL at the dangerous places, then restarted.

Each kill point runs in its own process (``driver.py``), started together so their
Spark sessions start in parallel. The deletion's process starts no Spark: this process
commits its log's batches first (as the driver would, with the same config). The restart
is a new sink object on the same path in this process: its recovery must remove what the
dead process left, and ``state()`` must equal a replay of the committed batches, with no
offset twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F
from testkit import (
    assert_offsets_unique,
    bad_rows_frame,
    batch_frame,
    batch_rows,
    live_offsets,
    replay,
    state_of,
    unreferenced_files,
    vacuum_config,
)

from checkpoints import CleanerOffsetCheckpoint
from sinks import CleanerConfig, CompactedStateSink
from sinks.crash_points import (
    APPEND_AFTER_STAGED_WRITE,
    APPEND_BEFORE_COMMIT,
    CLEAN_BEFORE_CHECKPOINT,
    CLEAN_BEFORE_COMMIT,
    CRASH_AT_ENV,
    DEAD_LETTER_BEFORE_APPEND,
    RECOVERY_AFTER_ORPHAN_DELETED,
    SCHEMA_BEFORE_APPEND,
    SEGMENT_DELETER_AFTER_FILE_DELETED,
)
from sinks.log.location import LogLocation
from sinks.log.log_format import STAGING_DIR
from sinks.log.ownership import foreign_entries
from sinks.maintenance.file_inventory import list_data_files
from sinks.produce.dead_letter import DeadLetterTable
from sinks.produce.spark_append import APPEND_WRITER_ENV, SPARK_WRITER

pytestmark = pytest.mark.crash

DRIVER = os.path.join(os.path.dirname(__file__), "driver.py")
KILLS = {
    "staged": APPEND_AFTER_STAGED_WRITE,
    "append": APPEND_BEFORE_COMMIT,
    "clean": CLEAN_BEFORE_COMMIT,
    "checkpoint": CLEAN_BEFORE_CHECKPOINT,
    "dead_letter": DEAD_LETTER_BEFORE_APPEND,
    "schema": SCHEMA_BEFORE_APPEND,
    "vacuum": f"{SEGMENT_DELETER_AFTER_FILE_DELETED}@1",
}
# The restarted sink deletes orphans at once: nothing else writes these logs.
RESTART = CleanerConfig(min_cleanable_dirty_ratio=1.0, file_delete_delay_ms=0)
COMMITTED = range(3)  # every driver commits batches 0, 1, 2 before the step that is killed
COMMITTED_HERE = ("vacuum",)
"""Scenarios whose batches this process commits: the step killed needs no Spark, and a Spark
session started only to commit three batches cost a process about 25 CPU seconds."""


@dataclass
class Run:
    lake: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def log(self) -> str:
        return os.path.join(self.lake, "log")

    def assert_killed_after_commits(self) -> None:
        assert self.returncode == -signal.SIGKILL, self.stderr[-2000:]
        committed_here = os.path.basename(self.lake) in COMMITTED_HERE
        assert committed_here or "committed 2" in self.stdout
        assert "finished" not in self.stdout


def run_driver(scenario: str, lake: str, crash_at: str) -> subprocess.Popen:
    env = {**os.environ, CRASH_AT_ENV: crash_at}
    if scenario == "staged":  # the append through Spark's own writer (sinks.produce.spark_append)
        env[APPEND_WRITER_ENV] = SPARK_WRITER
    return subprocess.Popen(
        [sys.executable, DRIVER, scenario, lake],
        cwd=lake,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Crashes:
    """The killed processes, started at once; `wait` collects one."""

    def __init__(self, root, spark) -> None:
        self.processes = {}
        for scenario in COMMITTED_HERE:
            (root / scenario).mkdir()
            sink = CompactedStateSink(str(root / scenario / "log"), config=vacuum_config())
            for batch_id in COMMITTED:
                sink(batch_frame(spark, batch_id), batch_id)
        for scenario, point in KILLS.items():
            lake = root / scenario
            lake.mkdir(exist_ok=True)
            self.processes[scenario] = (str(lake), run_driver(scenario, str(lake), point))

    def wait(self, scenario: str) -> Run:
        lake, process = self.processes[scenario]
        out, err = process.communicate(timeout=600)
        return Run(lake, process.returncode, out, err)


@pytest.fixture(scope="session")
def crashes(tmp_path_factory, classic_spark):
    started = Crashes(tmp_path_factory.mktemp("crashes"), classic_spark)
    yield started
    for _, process in started.processes.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


def assert_replays(sink, batches) -> int:
    """state() equals the oracle of ``batches``, no offset twice; returns records checked."""
    assert state_of(sink) == replay(batches).state
    return assert_offsets_unique(sink.path)


def assert_the_killed_batch_lands_once(sink, spark) -> None:
    """Spark replays the killed, uncommitted batch 3, and a duplicate delivery writes nothing."""
    sink(batch_frame(spark, 3), 3)
    sink(batch_frame(spark, 3), 3)
    assert_replays(sink, range(4))
    assert_contiguous(sink.path, range(4))


def assert_contiguous(path: str, batches) -> None:
    """Nothing lost, nothing duplicated: each partition holds offsets 0..n-1 exactly once."""
    expected: dict[int, int] = {}
    for _, _, p in (row for b in batches for row in batch_rows(b)):
        expected[p] = expected.get(p, 0) + 1
    assert {p: len(o) for p, o in live_offsets(path).items()} == expected
    assert all(o == list(range(len(o))) for o in live_offsets(path).values())


def test_kill_between_a_schema_commit_and_its_batch(crashes, spark):
    """The evolved schema is committed, the batch's files are written, its commit is not:
    every reader reads the log (the new column null), and the retried batch lands once."""
    run = crashes.wait("schema")
    run.assert_killed_after_commits()
    assert "note" in DeltaTable(run.log).schema().to_arrow().names
    left = unreferenced_files(run.log)
    assert left, "the killed append wrote no data file: the kill came too early"

    sink = CompactedStateSink(run.log, config=RESTART)
    assert set(sink.recover().orphans_removed) == set(left)
    assert_replays(sink, COMMITTED)
    assert {r["note"] for r in sink.log().collect()} == {None}
    assert DeltaTable(run.log).to_pyarrow_table().num_rows == sum(
        len(batch_rows(b)) for b in COMMITTED
    )
    # A zero history window lets the deleter trim the Delta log after the replay's append:
    # the commits are read before it and after, by version.
    before = commit_infos(run.log)
    sink(batch_frame(spark, 3).withColumn("note", F.lit("n3")), 3)  # the batch's replay
    sink(batch_frame(spark, 3).withColumn("note", F.lit("n3")), 3)  # and again: skipped
    operations = [info for _, info in sorted({**before, **commit_infos(run.log)}.items())]
    assert [o.get("batchId") for o in operations if o.get("operation") == "schema"] == [3]
    appends = [o.get("batchId") for o in operations if o.get("operation") == "append"]
    assert appends[:3] == [0, 1, 2] and appends[3:] in ([], [3])  # 3's own commit may be trimmed
    assert DeltaTable(run.log).transaction_version(sink.transactional_id.app_id(None)) == 3
    assert_replays(sink, [*COMMITTED, 3])
    assert_contiguous(run.log, [*COMMITTED, 3])
    notes = {r["note"] for r in sink.log().collect()}
    assert notes == {None, "n3"}


def commit_infos(log: str) -> dict[int, dict]:
    """The sink's commit info of each commit file the Delta log still holds, by version."""
    return {
        int(f.stem): json.loads(f.read_text().splitlines()[0])["commitInfo"].get(
            "compactedSink", {}
        )
        for f in Path(log, "_delta_log").glob("*.json")
    }


def test_kill_inside_append_after_files_before_commit(crashes, spark):
    run = crashes.wait("append")
    run.assert_killed_after_commits()
    left = unreferenced_files(run.log)
    assert left, "the killed append wrote no data file: the kill came too early"

    sink = CompactedStateSink(run.log, config=RESTART)
    report = sink.recover()
    assert set(report.orphans_removed) == set(left)
    assert unreferenced_files(run.log) == []
    assert_replays(sink, COMMITTED)
    assert_contiguous(run.log, COMMITTED)

    assert_the_killed_batch_lands_once(sink, spark)


def staged_entries(log: str) -> list[str]:
    """What lies in ``_staging/`` of the log (a killed append's staged Spark write)."""
    staging = Path(log, STAGING_DIR)
    return sorted(str(p.relative_to(log)) for p in staging.rglob("*")) if staging.exists() else []


def test_kill_inside_append_after_spark_wrote_before_its_files_are_segments(crashes, spark):
    """Spark's writer staged the batch's files (design.md §10, §26): they are the sink's own
    by their directory, recovery removes the directory, and the replayed batch lands once."""
    run = crashes.wait("staged")
    run.assert_killed_after_commits()
    staged = staged_entries(run.log)
    assert any(p.endswith(".parquet") for p in staged), "the kill came before Spark's write"
    assert unreferenced_files(run.log) == []  # nothing was renamed to a segment yet
    assert check_new_location_accepts(staged)

    sink = CompactedStateSink(run.log, config=RESTART)
    report = sink.recover()
    assert [p for p in report.orphans_removed if p.startswith(STAGING_DIR)] == [
        p + "/" for p in staged if p.count("/") == 1
    ]
    assert staged_entries(run.log) == []
    assert_replays(sink, COMMITTED)
    assert_contiguous(run.log, COMMITTED)

    assert_the_killed_batch_lands_once(sink, spark)
    assert staged_entries(run.log) == []


def check_new_location_accepts(staged: list[str]) -> bool:
    """A killed first batch could leave the same entries: the sink would create a log there."""
    return foreign_entries([(p, not p.endswith((".parquet", ".crc"))) for p in staged]) == []


def test_kill_inside_pass_after_files_then_inside_recovery(crashes, spark, tmp_path):
    run = crashes.wait("clean")
    run.assert_killed_after_commits()
    left = unreferenced_files(run.log)
    assert len(left) >= 2, "the killed pass should leave one file per partition"
    assert DeltaTable(run.log).history(1)[0]["operation"] != "clean"  # nothing committed

    # Recovery itself is killed after deleting the first orphan ...
    recovery = run_driver("recovery", run.lake, f"{RECOVERY_AFTER_ORPHAN_DELETED}@1")
    out, err = recovery.communicate(timeout=300)
    assert recovery.returncode == -signal.SIGKILL, err[-2000:]
    assert len(unreferenced_files(run.log)) == len(left) - 1

    # ... and the next open finishes it.
    sink = CompactedStateSink(run.log, config=RESTART)
    report = sink.recover()
    assert len(report.orphans_removed) == len(left) - 1
    assert unreferenced_files(run.log) == []
    assert_replays(sink, COMMITTED)
    assert_contiguous(run.log, COMMITTED)

    # The dead cleaner's claim does not block the restarted one (its process is gone).
    stats = sink.clean(force=True)
    assert stats is not None and set(stats.partitions) == {0, 1}
    assert_replays(sink, COMMITTED)
    rows = CleanerOffsetCheckpoint(sink.checkpoint_path).read(sink.path)
    snapshot = sink.log_table.snapshot()
    assert {p: e.first_dirty_offset for (_, p), e in rows.items()} == {
        p: snapshot.cleaner_offset(p) for p in (0, 1)
    }
    assert {e.cleaner_state for e in rows.values()} == {"idle"}


def test_kill_between_pass_commit_and_checkpoint(crashes, spark):
    run = crashes.wait("checkpoint")
    run.assert_killed_after_commits()
    snapshot = CompactedStateSink(run.log).log_table.snapshot()
    ends = {p: snapshot.cleaner_offset(p) for p in (0, 1)}
    assert ends == snapshot.log_end_offsets()  # the pass committed ...
    checkpoints = CleanerOffsetCheckpoint(os.path.join(run.lake, "_cleaner-offset-checkpoint"))
    rows = checkpoints.read(snapshot.uri)
    assert all(
        rows.get((snapshot.uri, p)) is None or rows[(snapshot.uri, p)].first_dirty_offset != e
        for p, e in ends.items()
    )  # ... and the checkpoint did not follow

    sink = CompactedStateSink(run.log, config=RESTART)
    report = sink.recover()
    assert {p: new for p, (_, new) in report.checkpoint_changes.items()} == ends
    assert {p: e.first_dirty_offset for (_, p), e in checkpoints.read(sink.path).items()} == ends
    assert unreferenced_files(run.log) == []
    assert_replays(sink, COMMITTED)
    assert sink.clean() is None  # everything below the log end is clean: nothing to redo


def test_kill_between_dead_letters_and_append(crashes, spark):
    run = crashes.wait("dead_letter")
    run.assert_killed_after_commits()
    dead = DeadLetterTable(LogLocation(os.path.join(run.lake, "dead-letters")))
    assert dead.read().column("batch_id").to_pylist() == [3, 3]

    sink = CompactedStateSink(
        run.log, config=RESTART, dead_letter_table=os.path.join(run.lake, "dead-letters")
    )
    sink.recover()
    assert_replays(sink, COMMITTED)
    sink(bad_rows_frame(spark, 3), 3)  # the replayed batch: dead letters are not written twice
    letters = dead.read()
    assert letters.column("batch_id").to_pylist() == [3, 3]
    assert set(letters.column("reason").to_pylist()) == {"null key (key)"}
    assert_replays(sink, range(4))
    assert_contiguous(run.log, range(4))


def test_kill_inside_deletion_loses_nothing_and_the_next_run_finishes(crashes, spark):
    run = crashes.wait("vacuum")
    run.assert_killed_after_commits()
    config = CleanerConfig(min_cleanable_dirty_ratio=1.0, file_delete_delay_ms=0)
    sink = CompactedStateSink(run.log, config=config)
    live = {s.path for s in sink.log_table.snapshot().all_segments()}
    left = {f.path for f in list_data_files(sink.log_table)} - live
    assert left, "the kill came after the first deleted file: the others must be left"
    assert_replays(sink, COMMITTED)  # nothing the log uses was touched

    report = sink.vacuum()
    assert set(report.deleted) == left
    assert {f.path for f in list_data_files(sink.log_table)} == live
    assert_replays(sink, COMMITTED)  # cleaned, so offsets have gaps: no contiguity check
