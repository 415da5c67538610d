"""The topic's config lives with the topic: stored on the log, obeyed by every process.

A notebook's sink creates a log with a 7-day ``delete.retention.ms``; a scheduled
``clean`` with no job file, the status report and a job with its own settings all read
it from the log. A process's explicit override is said in one line, a shorter
``delete.retention.ms`` is refused, and ``configs --alter`` changes the log's config in
one commit. A log created before configs were stored keeps working on defaults.
"""

from __future__ import annotations

import logging
import time

import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

import sinks.produce.log_append as log_append
from sinks import CleanerConfig, CompactedStateSink
from sinks.errors import ConfigError
from streaming.cli import main
from streaming.jobs.job import LogSpec
from streaming.jobs.registry import discover_logs
from streaming.status.gauges import log_status
from streaming.status.status_render import render_table

SCHEMA = T.StructType(
    [T.StructField("key", T.StringType()), T.StructField("value", T.StringType())]
)
DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
PREFIX = "compacted.sink.topic."


def append(spark, sink: CompactedStateSink, rows, batch_id: int) -> None:
    sink(spark.createDataFrame(rows, SCHEMA), batch_id)


def notebook_log(spark, path: str, clock) -> CompactedStateSink:
    """A notebook's log: 7-day tombstones, k1 deleted, the tombstone stamped by a pass."""
    sink = CompactedStateSink(
        path,
        config=CleanerConfig(delete_retention_ms=WEEK_MS, min_cleanable_dirty_ratio=1.0),
        clock=clock,
    )
    append(spark, sink, [("k0", "a"), ("k1", "b")], 0)
    append(spark, sink, [("k1", None)], 1)
    sink.clean(force=True)  # stamps k1's tombstone: horizon = this pass + 7 days
    return sink


def test_config_is_stored_on_the_log_at_creation(spark, lake, clock, delta_commits) -> None:
    sink = notebook_log(spark, str(lake / "users"), clock)
    (metadata,) = [a["metaData"] for a in delta_commits(sink.path)[0] if "metaData" in a]
    stored = metadata["configuration"]
    assert stored[PREFIX + "delete.retention.ms"] == str(WEEK_MS)
    assert stored[PREFIX + "min.cleanable.dirty.ratio"] == "1.0"
    assert stored[PREFIX + "cleanup.policy"] == "compact"
    assert not any(k.startswith(PREFIX + "log.cleaner") for k in stored)  # process settings
    assert stored["delta.deletedFileRetentionDuration"] == "interval 1 week"

    reopened = CompactedStateSink(sink.path)  # config=None: the log's
    assert reopened.config.delete_retention_ms == WEEK_MS
    assert reopened.config.min_cleanable_dirty_ratio == 1.0
    assert reopened.log_config.sources["delete.retention.ms"] == "log"


def test_clean_without_a_job_file_keeps_the_logs_tombstone_retention(spark, lake) -> None:
    # The notebook ran two days ago (its clock), so k1's tombstone is due in five days under
    # the log's 7 days, and would have been due yesterday under the 1-day default.
    two_days_ago = int(time.time() * 1000) - 2 * DAY_MS
    sink = notebook_log(spark, str(lake / "users"), lambda: two_days_ago)
    assert sink.log().filter("value IS NULL").count() == 1

    (ref,) = discover_logs(checkpoint_tables=[sink.checkpoint_path])
    assert ref.inferred and ref.sink().config.delete_retention_ms == WEEK_MS
    assert main(["clean", "--checkpoint-table", sink.checkpoint_path, "--once", "--force"]) == 0
    assert sink.log().filter("value IS NULL").count() == 1  # still there: consumers see it

    status = log_status(ref.sink(), settings_inferred=True)
    assert ("delete.retention.ms", str(WEEK_MS), "log") in status.config
    assert "delete.retention.ms=604800000 (log)" in render_table([status])
    assert "config (stored on the log)" in render_table([status])


def test_an_override_is_said_in_one_line_and_a_shorter_retention_refused(
    spark, lake, clock, caplog
) -> None:
    sink = notebook_log(spark, str(lake / "users"), clock)

    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        eager = CompactedStateSink(
            sink.path,
            config=CleanerConfig(min_cleanable_dirty_ratio=0.2, delete_retention_ms=2 * WEEK_MS),
        )
    (line,) = [r.getMessage() for r in caplog.records if "overrides" in r.getMessage()]
    assert "min.cleanable.dirty.ratio 1.0 -> 0.2" in line
    assert f"delete.retention.ms {WEEK_MS} -> {2 * WEEK_MS}" in line
    assert eager.config.min_cleanable_dirty_ratio == 0.2
    assert eager.config.delete_retention_ms == 2 * WEEK_MS
    assert eager.log_config.sources["min.cleanable.dirty.ratio"] == "override"
    assert eager.log_config.sources["segment.bytes"] == "log"
    status = log_status(eager)
    assert ("min.cleanable.dirty.ratio", "0.2", "override") in status.config

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        same = CompactedStateSink(sink.path, config=CleanerConfig(delete_retention_ms=WEEK_MS))
    assert same.config.min_cleanable_dirty_ratio == 1.0  # the log's, not the default 0.5
    assert not [r for r in caplog.records if "overrides" in r.getMessage()]

    with pytest.raises(ConfigError) as refused:
        CompactedStateSink(sink.path, config=CleanerConfig(delete_retention_ms=DAY_MS))
    message = str(refused.value)
    assert f"delete.retention.ms={DAY_MS}" in message and str(WEEK_MS) in message
    assert f"compacted-sink configs --path {sink.path} --alter" in message

    job = LogSpec(
        path=sink.path,
        key_columns=("key",),
        config=CleanerConfig.from_properties({"delete.retention.ms": "3600000"}),
    )
    with pytest.raises(ConfigError, match="shorter than the log's"):
        job.sink()
    # A job that sets only a process setting takes the log's topic config.
    quiet = LogSpec(
        path=sink.path,
        key_columns=("key",),
        config=CleanerConfig.from_properties({"log.cleaner.threads": "2"}),
    ).sink()
    assert quiet.config.delete_retention_ms == WEEK_MS and quiet.config.log_cleaner_threads == 2


def test_configs_alter_is_one_commit_in_the_history(spark, lake, clock, capsys) -> None:
    sink = notebook_log(spark, str(lake / "users"), clock)
    before = DeltaTable(sink.path).version()

    assert (
        main(
            [
                "configs",
                "--path",
                sink.path,
                "--alter",
                "--add-config",
                f"delete.retention.ms={2 * WEEK_MS},cleanup.policy=[compact,delete]",
            ]
        )
        == 0
    )
    table = DeltaTable(sink.path)
    assert table.version() == before + 1
    (commit,) = table.history(limit=1)
    assert commit["operation"] == "SET TBLPROPERTIES"
    assert commit["compactedSink"]["operation"] == "alter topic config"
    assert "delete.retention.ms" in capsys.readouterr().out
    reopened = CompactedStateSink(sink.path)
    assert reopened.config.delete_retention_ms == 2 * WEEK_MS
    assert reopened.config.cleanup_policy == "compact,delete"
    assert reopened.state().count() == 1  # the data commit guard takes it as the sink's own

    assert (
        main(["configs", "--path", sink.path, "--alter", "--delete-config", "cleanup.policy"]) == 0
    )
    assert DeltaTable(sink.path).version() == before + 2
    assert main(["configs", "--path", sink.path, "--describe"]) == 0
    described = capsys.readouterr().out
    assert "cleanup.policy=compact  (default)" in described
    assert f"delete.retention.ms={2 * WEEK_MS}  (log)" in described
    assert DeltaTable(sink.path).version() == before + 2  # describing commits nothing

    for bad, named in [
        ("delete.retention.msx=5", "delete.retention.msx"),
        ("delete.retention.ms=soon", "delete.retention.ms"),
        ("min.cleanable.dirty.ratio=2", "min.cleanable.dirty.ratio"),
        ("log.cleaner.threads=4", "log.cleaner.threads"),
    ]:
        code = main(["configs", "--path", sink.path, "--alter", "--add-config", bad])
        assert code == 2
        assert named in capsys.readouterr().err
    assert DeltaTable(sink.path).version() == before + 2  # nothing committed


def test_a_log_without_stored_config_keeps_working(spark, lake, clock, monkeypatch) -> None:
    # What the sink wrote before topic configs were stored: the key columns, the window.
    monkeypatch.setattr(log_append, "topic_table_properties", lambda config: {})
    old = CompactedStateSink(
        str(lake / "old"), config=CleanerConfig(delete_retention_ms=WEEK_MS), clock=clock
    )
    append(spark, old, [("k0", "a"), ("k0", "b")], 0)
    monkeypatch.undo()

    reopened = CompactedStateSink(old.path)
    assert not reopened.log_config.recorded
    assert reopened.config.delete_retention_ms == DAY_MS  # the default, as before
    shorter = CompactedStateSink(old.path, config=CleanerConfig(delete_retention_ms=60_000))
    assert shorter.config.delete_retention_ms == 60_000  # nothing on the log to shorten
    status = log_status(reopened)
    assert not status.config_stored
    assert "config (not stored on the log)" in render_table([status])
    append(spark, reopened, [("k1", "c")], 1)
    assert reopened.state().count() == 2

    # configs --alter stores one on it.
    assert (
        main(
            [
                "configs",
                "--path",
                old.path,
                "--alter",
                "--add-config",
                f"delete.retention.ms={WEEK_MS}",
            ]
        )
        == 0
    )
    assert CompactedStateSink(old.path).config.delete_retention_ms == WEEK_MS
