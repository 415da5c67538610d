"""Job files: Kafka's dotted names in, and every error names the file and the key (no Spark)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from sinks.errors import ConfigError
from sinks.log.records import VALUE
from streaming.jobs.job import JobConfigError, load_job

GOOD = """
[source]
format = "files"
path = "input"

[sink]
path = "lake/users"
key_columns = ["tenant", "id"]

[cleaner]
"min.cleanable.dirty.ratio" = 0.25
"delete.retention.ms" = "1000"
"cleanup.policy" = "compact,delete"

[trigger]
processing_time = "5 seconds"
"""


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_job_resolves_paths_and_reads_dotted_names(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, GOOD))
    (log,) = job.logs
    assert log.path == str(tmp_path / "lake" / "users")
    assert log.key_columns == ("tenant", "id")
    assert log.config.min_cleanable_dirty_ratio == 0.25
    assert log.config.delete_retention_ms == 1000
    assert log.config.cleanup_policy == "compact,delete"
    assert job.source["path"] == str(tmp_path / "input")
    assert job.trigger == {"processing_time": "5 seconds"}
    assert not job.routed


def test_topics_route_to_their_own_logs_with_their_own_settings(tmp_path: Path) -> None:
    text = GOOD.replace('[sink]\npath = "lake/users"\nkey_columns = ["tenant", "id"]', "")
    text += """
[topics.users]
path = "lake/users"

[topics.orders]
path = "lake/orders"
key_columns = ["order_id"]
cleaner = { "min.cleanable.dirty.ratio" = 0.75 }
"""
    job = load_job(write(tmp_path, text))
    by_topic = {log.topic: log for log in job.logs}
    assert job.routed
    assert by_topic["users"].config.min_cleanable_dirty_ratio == 0.25
    assert by_topic["orders"].config.min_cleanable_dirty_ratio == 0.75
    assert by_topic["orders"].key_columns == ("order_id",)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            ('"min.cleanable.dirty.ratio" = 0.25', '"min.cleanable.dirty.ratio" = 2'),
            "min.cleanable.dirty.ratio",
        ),
        (
            ('"delete.retention.ms" = "1000"', '"delete.retention.ms" = "soon"'),
            "delete.retention.ms",
        ),
        (('"cleanup.policy" = "compact,delete"', '"cleanup.policy" = "shred"'), "cleanup.policy"),
        (('"delete.retention.ms"', '"delete.retention.mss"'), "delete.retention.mss"),
        (('format = "files"', 'format = "socket"'), "source.format"),
        (('key_columns = ["tenant", "id"]', "key_columns = []"), "sink.key_columns"),
        (('path = "lake/users"', 'paht = "lake/users"'), "sink.paht"),
        (('processing_time = "5 seconds"', "available_now = true\nonce = true"), "trigger"),
        (
            ('key_columns = ["tenant", "id"]', 'key_columns = ["id"]\nschema_evolution = "merge"'),
            "sink.schema_evolution",
        ),
        (
            ('key_columns = ["tenant", "id"]', 'key_columns = ["id"]\nvalue_format = "debezium"'),
            "sink.value_format",
        ),
    ],
)
def test_bad_configuration_names_the_key_and_the_file(
    tmp_path: Path, change: tuple[str, str], key: str
) -> None:
    old, new = change
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1), "broken.toml")
    with pytest.raises(JobConfigError) as caught:
        load_job(path)
    assert str(path) in str(caught.value)
    assert key in str(caught.value)


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match="missing.toml"):
        load_job(tmp_path / "missing.toml")
    with pytest.raises(JobConfigError, match="not valid TOML"):
        load_job(write(tmp_path, "[source\n"))


def key_columns_of(columns: Iterable[str]) -> tuple[str, ...]:
    """The key columns of a log's schema: every column before ``value``."""
    names = list(columns)
    if VALUE not in names or names.index(VALUE) == 0:
        raise ConfigError(f"cannot tell the key columns of a log with columns {names}")
    return tuple(names[: names.index(VALUE)])


def test_key_columns_are_the_columns_before_value() -> None:
    assert key_columns_of(["tenant", "id", "value", "partition", "offset"]) == ("tenant", "id")


def test_schema_evolution_is_additive_unless_the_job_says_none(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, GOOD))
    assert [log.schema_evolution for log in job.logs] == ["additive"]
    text = GOOD.replace(
        'key_columns = ["tenant", "id"]', 'key_columns = ["id"]\nschema_evolution = "none"'
    )
    job = load_job(write(tmp_path, text, "none.toml"))
    assert [log.schema_evolution for log in job.logs] == ["none"]


def test_value_format_names_debeziums_change_events(tmp_path: Path) -> None:
    assert [log.value_format for log in load_job(write(tmp_path, GOOD)).logs] == [None]
    text = GOOD.replace(
        'key_columns = ["tenant", "id"]', 'key_columns = ["id"]\nvalue_format = "debezium-json"'
    )
    (log,) = load_job(write(tmp_path, text, "cdc.toml")).logs
    assert log.value_format == "debezium-json"
    sink = log.sink()
    assert (sink.value_format, sink.sequence_column) == ("debezium-json", "source_position")
