"""A Kafka user's topic config taken as it is, without Spark: what ``kafka-configs --describe``
prints, Kafka's names that do not apply here, and the name that means something else here."""

# ruff: noqa: E501 - Kafka's tool prints each config on one long line, kept verbatim here

from __future__ import annotations

import logging

import pytest
from deltalake import DeltaTable

from sinks import warn_once as warn_once_module
from sinks.config import (
    DEFAULT_SEGMENT_BYTES,
    KAFKA_TOPIC_CONFIGS_NOT_APPLYING,
    CleanerConfig,
    parse_kafka_describe,
)
from sinks.errors import ConfigError
from streaming.cli import main
from streaming.cli.configs import from_describe

# `kafka-configs.sh --bootstrap-server ... --entity-type topics --entity-name users --describe`
# (Kafka 4.1): the topic's own settings.
DESCRIBE = """\
Dynamic configs for topic users are:
  cleanup.policy=compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact, DEFAULT_CONFIG:log.cleanup.policy=delete}
  delete.retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:delete.retention.ms=3600000, DEFAULT_CONFIG:log.cleaner.delete.retention.ms=86400000}
  segment.ms=100 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:segment.ms=100, DEFAULT_CONFIG:log.roll.hours=168}
  max.message.bytes=2000000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:max.message.bytes=2000000, DEFAULT_CONFIG:message.max.bytes=1048588}
  compression.type=zstd sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:compression.type=zstd, DEFAULT_CONFIG:compression.type=producer}
"""

# The same with --all: every config, Kafka's defaults among them (sources DEFAULT_CONFIG).
DESCRIBE_ALL = """\
All configs for topic users are:
  cleanup.policy=compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact, DEFAULT_CONFIG:log.cleanup.policy=delete}
  compression.gzip.level=-1 sensitive=false synonyms={DEFAULT_CONFIG:compression.gzip.level=-1}
  file.delete.delay.ms=60000 sensitive=false synonyms={DEFAULT_CONFIG:log.segment.delete.delay.ms=60000}
  flush.ms=9223372036854775807 sensitive=false synonyms={}
  leader.replication.throttled.replicas= sensitive=false synonyms={}
  min.insync.replicas=1 sensitive=false synonyms={DEFAULT_CONFIG:min.insync.replicas=1}
  segment.bytes=1073741824 sensitive=false synonyms={DEFAULT_CONFIG:log.segment.bytes=1073741824}
  segment.ms=100 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:segment.ms=100, DEFAULT_CONFIG:log.roll.hours=168}
  min.compaction.lag.ms=5000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:min.compaction.lag.ms=5000}
"""


@pytest.fixture(autouse=True)
def said_afresh(monkeypatch):
    """Each test sees the once-per-process warnings as a new process would."""
    monkeypatch.setattr(warn_once_module, "_SAID", set())


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_whole_topic_config_is_accepted_and_what_does_not_apply_is_named_once(caplog):
    settings = parse_kafka_describe(DESCRIBE)
    assert settings["segment.ms"] == "100" and len(settings) == 5
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        config = CleanerConfig.from_properties(settings)
        again = CleanerConfig.from_properties(DESCRIBE)  # the text form too
    assert config == again
    assert config.cleanup_policy == "compact"
    assert config.delete_retention_ms == 3_600_000
    assert config.message_max_bytes == 2_000_000  # Kafka's topic-level max.message.bytes
    assert config.compression_type == "zstd"  # the codec of the files written
    (line,) = warnings(caplog)  # once per process, not once per call
    assert "config segment.ms does not apply to a log on Delta" in line


def test_describe_all_leaves_kafkas_defaults_to_the_sinks(caplog):
    settings = parse_kafka_describe(DESCRIBE_ALL)
    # Kafka's built-in defaults (DEFAULT_CONFIG) are left out: a 1 GiB segment.bytes or a
    # 60 s file.delete.delay.ms would mean something else here.
    assert "segment.bytes" not in settings and "file.delete.delay.ms" not in settings
    assert settings["flush.ms"] == "9223372036854775807"
    assert settings["leader.replication.throttled.replicas"] == ""
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        config = CleanerConfig.from_properties(DESCRIBE_ALL)
    assert config.segment_bytes == DEFAULT_SEGMENT_BYTES
    assert config.min_compaction_lag_ms == 5000
    (line,) = warnings(caplog)
    assert "flush.ms, leader.replication.throttled.replicas, segment.ms do not apply" in line


def test_an_unknown_key_still_fails_naming_it():
    with pytest.raises(ConfigError, match="unknown cleaner property 'segment.msec'"):
        CleanerConfig.from_properties({"segment.msec": "100", "segment.ms": "100"})
    with pytest.raises(ConfigError, match="line 2 .* not KEY=VALUE"):
        parse_kafka_describe("Dynamic configs for topic users are:\n  what is this\n")


def test_segment_bytes_says_what_it_means_here(caplog):
    with pytest.raises(
        ConfigError, match="segment.bytes .*the largest Parquet file a cleaner pass"
    ):
        CleanerConfig.from_properties({"segment.bytes": "0"})
    with pytest.raises(ConfigError, match="the largest Parquet file a cleaner pass writes"):
        CleanerConfig(segment_bytes=-1)
    with caplog.at_level(logging.WARNING, logger="compacted_sink"):
        config = CleanerConfig.from_properties({"segment.bytes": "1073741824"})
        CleanerConfig.from_properties({"segment.bytes": "1073741824"})
    assert config.segment_bytes == 1024**3  # taken as given, and said once
    (line,) = warnings(caplog)
    assert "segment.bytes=1073741824 (Kafka's default) is here the largest Parquet file" in line


def test_the_list_of_kafka_topic_configs_keeps_the_ones_that_apply_out():
    applying = set(CleanerConfig().to_properties()) | {"max.message.bytes"}
    assert not applying & KAFKA_TOPIC_CONFIGS_NOT_APPLYING
    assert {"segment.ms", "flush.ms", "compression.zstd.level"} <= KAFKA_TOPIC_CONFIGS_NOT_APPLYING
    assert "compression.type" in CleanerConfig().topic_properties()


def test_configs_alter_from_describe_and_describe_says_what_segment_bytes_is(
    tmp_path, monkeypatch, capsys
):
    import pyarrow as pa
    from deltalake import write_deltalake

    from sinks.log.ownership import LOG_DESCRIPTION

    log = str(tmp_path / "users")
    write_deltalake(
        log,
        pa.table({"key": [b"k"], "value": [b"v"], "partition": [0], "offset": [0]}),
        description=LOG_DESCRIPTION,  # the mark of a log this package created
    )
    (tmp_path / "users.describe").write_text(DESCRIBE)
    file = str(tmp_path / "users.describe")
    assert from_describe(DESCRIBE)[1] == ["segment.ms"]
    assert main(["configs", "--path", log, "--alter", "--from-describe", file]) == 0
    said = capsys.readouterr().out
    assert "ignored: segment.ms" in said
    assert "delete.retention.ms (default) -> 3600000" in said
    assert "message.max.bytes (default) -> 2000000" in said
    assert (
        DeltaTable(log).metadata().configuration["compacted.sink.topic.message.max.bytes"]
        == "2000000"
    )
    assert main(["configs", "--path", log, "--describe"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (segment,) = [x for x in lines if x.strip().startswith("segment.bytes=")]
    assert "the largest Parquet file a cleaner pass writes" in segment
    assert main(["configs", "--path", log, "--alter", "--add-config", "segment.ms=1"]) == 2
    assert "segment.ms is a Kafka topic config that does not apply" in capsys.readouterr().err
