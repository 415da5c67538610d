"""One committer (design.md §36): every commit the sink makes to a log goes through it.

A committer that records each call and hands it on to delta-rs's is put on a sink's log;
then an append, a schema change, a pass, a config change, a retention commit and a
restore run. The Delta log gains exactly one commit per recorded call, and nothing
else: no path commits to the log around the seam.
"""

from __future__ import annotations

from typing import Any

from sinks import CleanerConfig, CompactedStateSink
from sinks.log.committer import DELTA_RS
from sinks.log.log_config import alter_log_config


class RecordingCommitter:
    """delta-rs's committer, with each call's name recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(DELTA_RS, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return recorded


def _batch(spark, batch_id: int, extra: bool = False):
    rows = [(f"k{i % 7}", f"v{batch_id}-{i}") for i in range(20)]
    df = spark.createDataFrame(rows, "key string, value string")
    return df.selectExpr("*", "'x' AS extra") if extra else df


def test_every_commit_to_the_log_goes_through_its_committer(spark, lake, delta_commits):
    path = str(lake / "log")
    config = CleanerConfig(min_cleanable_dirty_ratio=0.99)
    with CompactedStateSink(path, cleaning="inline", config=config) as sink:
        sink(_batch(spark, 0), 0)  # creates the log through the default committer
        recorder = RecordingCommitter()
        sink.log_table.committer = recorder
        before = len(delta_commits(path))

        sink(_batch(spark, 1), 1)
        sink(_batch(spark, 2, extra=True), 2)  # a new column: the schema commits first
        restore_to = len(delta_commits(path)) - 1
        assert sink.clean(force=True) is not None
        alter_log_config(sink.log_table, add={"min.cleanable.dirty.ratio": "0.5"})
        sink.delete_records(0, 5)
        sink.restore(restore_to)

    assert len(delta_commits(path)) - before == len(recorder.calls)
    assert recorder.calls.count("commit_schema") == 1
    assert recorder.calls.count("set_properties") == 1
    assert recorder.calls.count("restore") == 1
    assert recorder.calls.count("commit_files") >= 4  # two appends, the pass, retention
    assert set(recorder.calls) <= {"commit_files", "commit_schema", "set_properties", "restore"}
