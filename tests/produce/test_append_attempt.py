"""The append's retry loop without Spark: an attempt that conflicts, over Arrow rows.

Another writer commits between the attempt's write and its commit (the crash point
before the commit runs it). Each case checks the outcome and that the files the
attempt will not commit are gone: every Parquet file on disk is live in the log.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import types as T
from testkit import checkpoint_and_trim

from sinks import CleanerConfig
from sinks.crash_points import APPEND_BEFORE_COMMIT, armed
from sinks.errors import CommitConflictError, ConfigError
from sinks.log.log_keys import LogKeys
from sinks.log.log_table import LogTable
from sinks.produce import log_append
from sinks.produce.append_batch import ArrowRecords
from sinks.produce.log_append import LogAppender
from sinks.produce.spark_append import APPEND_WRITER_ENV, PYTHON_WRITER, SPARK_WRITER

NO_CLEAN = CleanerConfig(min_cleanable_dirty_ratio=1.0)
SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("value", T.StringType()),
        T.StructField("partition", T.IntegerType()),
    ]
)


def batch(keys: list[str], partition: int = 0) -> ArrowRecords:
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array(["v"] * len(keys), pa.string()),
            "partition": pa.array([partition] * len(keys), pa.int32()),
        }
    )
    return ArrowRecords(table, SCHEMA)


def appender(path: Path, **kwargs) -> LogAppender:
    return LogAppender(
        LogTable(str(path)), keys=LogKeys(key_columns=("key",)), config=NO_CLEAN, **kwargs
    )


def live_and_on_disk(path: Path) -> tuple[set[str], set[str]]:
    snapshot = LogTable(str(path)).snapshot()
    assert snapshot is not None
    live = {s.path for s in snapshot.all_segments()}
    on_disk = {
        str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts
    }
    return live, on_disk


def test_offsets_taken_by_another_writer_number_the_batch_again(lake):
    path = lake / "log"
    ours, theirs = appender(path), appender(path)
    ours.append(batch(["a", "b"]), app_id="ours", batch_id=0)
    with armed(APPEND_BEFORE_COMMIT, lambda: theirs.append(batch(["x"]), app_id="t", batch_id=0)):
        info = ours.append(batch(["c", "d"]), app_id="ours", batch_id=1)
    assert [(w.partition, w.base_offset, w.last_offset) for w in info.written] == [(0, 3, 4)]
    assert not info.already_committed and info.snapshot.log_end_offset(0) == 5
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live and len(live) == 3  # the first numbering's file was cleaned up


def test_a_conflict_elsewhere_commits_the_same_files_again(lake):
    path = lake / "log"
    ours, theirs = appender(path), appender(path)
    ours.append(batch(["a"]), app_id="ours", batch_id=0)
    with armed(
        APPEND_BEFORE_COMMIT, lambda: theirs.append(batch(["x"], 1), app_id="t", batch_id=0)
    ):
        info = ours.append(batch(["c", "d"]), app_id="ours", batch_id=1)
    assert [(w.partition, w.base_offset) for w in info.written] == [(0, 1)]
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live and len(live) == 3


def test_a_log_trimmed_past_the_version_the_attempt_read_commits_the_same_files_again(lake):
    """While the attempt writes, another writer commits, checkpoints and trims the commit the
    attempt read: delta-rs cannot rebase the commit over a version that is gone (it raised
    ``Invalid table version``, which failed the batch), so the attempt reads the log again."""
    path = lake / "log"
    ours, theirs = appender(path), appender(path)
    ours.append(batch(["a"]), app_id="ours", batch_id=0)

    def move_on_and_trim() -> None:
        theirs.append(batch(["x"], 1), app_id="t", batch_id=0)
        checkpoint_and_trim(str(path))

    with armed(APPEND_BEFORE_COMMIT, move_on_and_trim):
        info = ours.append(batch(["c", "d"]), app_id="ours", batch_id=1)
    assert [(w.partition, w.base_offset, w.last_offset) for w in info.written] == [(0, 1, 2)]
    assert info.snapshot.log_end_offsets() == {0: 3, 1: 1}
    assert info.snapshot.txn_version("ours") == 1
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live and len(live) == 3


def test_a_batch_another_writer_committed_first_is_not_added_again(lake):
    path = lake / "log"
    ours, twin = appender(path), appender(path)
    ours.append(batch(["a"]), app_id="app", batch_id=0)
    with armed(APPEND_BEFORE_COMMIT, lambda: twin.append(batch(["c"]), app_id="app", batch_id=1)):
        info = ours.append(batch(["c"]), app_id="app", batch_id=1)
    assert info.already_committed and not info.written
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live and len(live) == 2  # our copy of batch 1 was cleaned up


def test_conflicts_that_never_settle_give_up_and_leave_nothing(lake, monkeypatch):
    path = lake / "log"
    ours, theirs = appender(path), appender(path)
    ours.append(batch(["a"]), app_id="ours", batch_id=0)
    monkeypatch.setattr(log_append, "APPEND_ATTEMPTS", 2)
    others = iter(range(1, 100))
    inside: list[bool] = []

    def another_append() -> None:  # the other writer's own append reaches the point too
        if not inside:
            inside.append(True)
            theirs.append(batch(["x"]), app_id="t", batch_id=next(others))
            inside.clear()

    with (
        armed(APPEND_BEFORE_COMMIT, another_append, once=False),
        pytest.raises(CommitConflictError, match="kept conflicting after 2 attempts"),
    ):
        ours.append(batch(["c"]), app_id="ours", batch_id=1)
    live, on_disk = live_and_on_disk(path)
    assert on_disk == live
    assert LogTable(str(path)).snapshot().txn_version("ours") == 0


def test_the_writer_is_chosen_once_when_the_appender_is_built(lake, monkeypatch):
    monkeypatch.setenv(APPEND_WRITER_ENV, " Spark ")
    built = appender(lake / "log")
    monkeypatch.setenv(APPEND_WRITER_ENV, PYTHON_WRITER)
    assert built.writer == SPARK_WRITER  # read at build time, not per batch
    assert appender(lake / "log", writer=PYTHON_WRITER).writer == PYTHON_WRITER
    monkeypatch.setenv(APPEND_WRITER_ENV, "jvm")
    with pytest.raises(ConfigError, match="COMPACTED_SINK_APPEND_WRITER='jvm' names no"):
        appender(lake / "log")
