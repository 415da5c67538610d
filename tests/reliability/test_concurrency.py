"""design.md §11: a cleaner process beside a streaming query, racing cleaners, racing appends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F
from testkit import (
    assert_offsets_unique,
    batch_frame,
    batch_rows,
    replay,
    state_of,
    unreferenced_files,
)

from sinks import CleanerConfig, CleanerError, CommitConflictError, CompactedStateSink
from sinks.crash_points import APPEND_BEFORE_COMMIT, CLEAN_BEFORE_COMMIT, armed

pytestmark = pytest.mark.crash

DRIVER = os.path.join(os.path.dirname(__file__), "driver.py")
NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
ROWS_PER_BATCH = 30
KEYS = 13


def operations(path: str) -> list[str]:
    return [h["operation"] for h in reversed(DeltaTable(path).history())]


def commit_kinds(path: str) -> list[str]:
    kinds = []
    for h in reversed(DeltaTable(path).history()):
        info = h.get("compactedSink") or {}
        if isinstance(info, str):
            info = json.loads(info)
        kinds.append(info.get("operation", h["operation"]))
    return kinds


def test_append_whose_commit_races_a_pass_is_retried_and_loses_nothing(spark, lake, clock):
    path = str(lake / "log")
    writer = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    cleaner = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    for b in range(2):
        writer(batch_frame(spark, b), b)

    # The pass commits while the append has written its files and not yet committed.
    with armed(APPEND_BEFORE_COMMIT, lambda: cleaner.clean(force=True)):
        writer(batch_frame(spark, 2), 2)

    assert commit_kinds(path)[-2:] == ["clean", "append"]
    assert state_of(writer) == replay(range(3)).state
    assert assert_offsets_unique(path) > 0
    snapshot = writer.log_table.snapshot()
    appended = {p: sum(1 for b in range(3) for *_, q in batch_rows(b) if q == p) for p in (0, 1)}
    assert snapshot.log_end_offsets() == appended
    assert unreferenced_files(path) == []  # the retried append left no file behind


def test_two_cleaners_racing_one_commits_the_other_plans_again(spark, lake, clock):
    path = str(lake / "log")
    first = CompactedStateSink(path, config=NO_CLEAN, clock=clock)
    for b in range(3):
        first(batch_frame(spark, b), b)

    class Later:  # the second cleaner believes the first one's claim expired (a stalled pass)
        def __call__(self):
            return clock() + 3_600_000

    second = CompactedStateSink(path, config=NO_CLEAN, clock=Later())
    won = []
    with armed(CLEAN_BEFORE_COMMIT, lambda: won.append(second.clean(force=True))):
        # The loser's commit conflicts; it plans again from the winner's version
        # (`Cleaner.run_pass`, PASS_ATTEMPTS) and finds nothing left to clean.
        assert first.clean(force=True) is None

    assert won and won[0] is not None
    assert commit_kinds(path).count("clean") == 1
    assert state_of(first) == replay(range(3)).state
    assert_offsets_unique(path)
    assert unreferenced_files(path) == []  # the loser deleted the files it wrote
    assert first.clean(force=True) is None  # nothing left to clean: the winner's pass counts


def test_cleaner_job_in_its_own_process_beside_a_streaming_query(spark, tmp_path):
    lake = tmp_path / "lake"
    lake.mkdir()
    path = str(lake / "log")
    job = subprocess.Popen(
        [sys.executable, DRIVER, "cleaner_loop", str(lake)],
        cwd=str(lake),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline().strip() == "ready", job.stderr.read()[-2000:]
        sink = CompactedStateSink(path, config=NO_CLEAN)
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", ROWS_PER_BATCH)
            .option("numPartitions", 1)
            .load()
            .select(
                F.concat(F.lit("k"), (F.col("value") % KEYS).cast("string")).alias("key"),
                F.col("value").cast("string").alias("value"),
                ((F.col("value") % KEYS) % 2).cast("int").alias("partition"),
            )
        )
        query = (
            source.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(processingTime="300 milliseconds")
            .start()
        )
        # A second cleaner in this process races the job's passes.
        stop = threading.Event()
        local = {"passes": 0, "conflicts": 0}

        def clean_here():
            cleaner = CompactedStateSink(path, config=NO_CLEAN)
            while not stop.is_set():
                try:
                    local["passes"] += cleaner.clean(force=True) is not None
                except (CleanerError, CommitConflictError, FileNotFoundError):
                    local["conflicts"] += 1
                time.sleep(0.3)

        thread = threading.Thread(target=clean_here)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(path, "_delta_log")):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        thread.start()
        while time.monotonic() < deadline:
            kinds = commit_kinds(path)
            if kinds.count("append") >= 12 and kinds.count("clean") >= 3:
                break
            time.sleep(1)
        settle = time.monotonic() + 5
        while query.status["isTriggerActive"] and time.monotonic() < settle:
            time.sleep(0.05)  # rather stop between batches than inside one
        query.stop()
        stop.set()
        thread.join()
    finally:
        (lake / "stop").touch()
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])

    kinds = commit_kinds(path)
    last_batch = sink.log_table.snapshot().txn_version(f"{sink.sink_id}/query={query.id}")
    values = range((last_batch + 1) * ROWS_PER_BATCH)
    expected = {f"k{m}": str(max(v for v in values if v % KEYS == m)) for m in range(KEYS)}
    assert state_of(sink) == expected
    assert assert_offsets_unique(path) >= KEYS
    appended = {p: sum(1 for v in values if (v % KEYS) % 2 == p) for p in (0, 1)}
    assert sink.log_table.snapshot().log_end_offsets() == appended
    assert kinds.count("append") >= 12  # the query kept appending ...
    assert summary["passes"] >= 1  # ... while the job's passes committed
    assert kinds.count("clean") == summary["passes"] + local["passes"]
    print("cleaner job", summary, "in-process cleaner", local, "appends", kinds.count("append"))
