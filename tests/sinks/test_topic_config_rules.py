"""The rules of a log's topic config, without Spark: explicit settings, resolution, parsing."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sinks.config import CleanerConfig
from sinks.errors import CompactedSinkError, ConfigError
from sinks.log.log_config import LogConfig, alter_log_config, resolve, topic_table_properties
from sinks.log.log_table import LogTable
from streaming.cli.configs import parse_add_config

WEEK_MS = 604_800_000
STORED = {
    "compacted.sink.topic.delete.retention.ms": str(WEEK_MS),
    "compacted.sink.topic.min.cleanable.dirty.ratio": "0.9",
    "compacted.sink.topic.segment.bytes": "",  # deleted: the default applies
    "delta.deletedFileRetentionDuration": "interval 2 days",
    "compacted.sink.key.columns": '["key"]',
}


def test_a_config_knows_which_settings_were_named() -> None:
    config = CleanerConfig(delete_retention_ms=5, log_cleaner_threads=2)
    assert config.explicit == {"delete.retention.ms", "log.cleaner.threads"}
    assert CleanerConfig().explicit == frozenset()
    assert CleanerConfig.from_properties({"retention.ms": "9"}).explicit == {"retention.ms"}
    assert pickle.loads(pickle.dumps(config)).explicit == config.explicit
    assert config.with_settings(backoff_ms=1).explicit == {
        "delete.retention.ms",
        "log.cleaner.threads",
        "log.cleaner.backoff.ms",
    }
    assert config == CleanerConfig(delete_retention_ms=5, log_cleaner_threads=2)
    stored = topic_table_properties(config)
    assert stored["compacted.sink.topic.delete.retention.ms"] == "5"
    assert not any("log.cleaner" in k or "file.delete" in k for k in stored)


def test_the_logs_config_beats_defaults_and_an_explicit_setting_beats_the_log() -> None:
    log = LogConfig.from_table_properties(STORED)
    assert log.properties == {
        "delete.retention.ms": str(WEEK_MS),
        "min.cleanable.dirty.ratio": "0.9",
        "file.delete.delay.ms": str(2 * 86_400_000),
    }
    applied = resolve(log, CleanerConfig(log_cleaner_threads=3), log_path="lake/users")
    assert applied.config.delete_retention_ms == WEEK_MS
    assert applied.config.file_delete_delay_ms == 2 * 86_400_000
    assert applied.config.log_cleaner_threads == 3  # a process setting stays the process's
    assert applied.sources["segment.bytes"] == "default" and not applied.overrides

    eager = resolve(
        log, CleanerConfig(min_cleanable_dirty_ratio=0.1, segment_bytes=10), log_path="l"
    )
    assert eager.config.min_cleanable_dirty_ratio == 0.1
    assert eager.overrides == (
        ("min.cleanable.dirty.ratio", "0.9", "0.1"),
        ("segment.bytes", str(CleanerConfig().segment_bytes), "10"),
    )
    assert "min.cleanable.dirty.ratio 0.9 -> 0.1" in eager.override_line("l")

    longer = resolve(log, CleanerConfig(delete_retention_ms=2 * WEEK_MS), log_path="l")
    assert longer.config.delete_retention_ms == 2 * WEEK_MS
    with pytest.raises(ConfigError, match="shorter than the log's 604800000"):
        resolve(log, CleanerConfig(delete_retention_ms=WEEK_MS - 1), log_path="l")


def test_a_log_without_stored_config_takes_the_process_settings() -> None:
    old = LogConfig.from_table_properties({"compacted.sink.key.columns": '["key"]'})
    assert not old.recorded
    applied = resolve(old, CleanerConfig(delete_retention_ms=1), log_path="l")
    assert applied.config.delete_retention_ms == 1 and not applied.overrides
    assert applied.sources["delete.retention.ms"] == "override"
    assert applied.sources["cleanup.policy"] == "default"


def test_a_bad_stored_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="min.cleanable.dirty.ratio"):
        LogConfig.from_table_properties({"compacted.sink.topic.min.cleanable.dirty.ratio": "2"})


def test_configs_refuses_a_table_that_is_not_a_compacted_log(tmp_path) -> None:
    path = str(tmp_path / "plain")
    write_deltalake(path, pa.table({"id": [1], "name": ["a"]}))
    with pytest.raises(CompactedSinkError, match="not a compacted log"):
        alter_log_config(LogTable(path), add={"delete.retention.ms": "1"})
    assert DeltaTable(path).version() == 0  # nothing committed


def test_add_config_takes_kafkas_brackets() -> None:
    assert parse_add_config(["a.b=1,cleanup.policy=[compact,delete]", "c=2"]) == {
        "a.b": "1",
        "cleanup.policy": "compact,delete",
        "c": "2",
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_add_config(["delete.retention.ms"])
